// File: common/grpc_credentials.h
//
// TLS for Loom's gRPC servers and clients, optional: with no certificate files everything stays
// plaintext (the local-cluster default). PEM files; server-side TLS only (clients verify the
// server against a CA bundle; no client certificates). Bearer tokens ride in call metadata
// (AddBearerToken), so they are only safe on TLS channels or on loopback.
#ifndef LOOM_COMMON_GRPC_CREDENTIALS_H_
#define LOOM_COMMON_GRPC_CREDENTIALS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/auth.h"

namespace loom {

// --tls_cert/--tls_key: both empty = plaintext (InsecureServerCredentials); both set = TLS with
// that certificate chain and private key. INVALID_ARGUMENT if only one is set; NOT_FOUND /
// INTERNAL if a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// --tls_ca: empty = plaintext; else TLS verifying the server against the CA certificates in
// `ca_file`. NOT_FOUND / INTERNAL if it cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file);

// The caller of a request from its `authorization: Bearer <token>` metadata. `auth` == nullptr
// means authentication is off: tenant "default" with admin rights. UNAUTHENTICATED when the
// metadata has no token `auth` knows.
absl::StatusOr<Caller> CallerFromMetadata(const grpc::ServerContextBase& context,
                                          const TokenAuthenticator* auth);

// Adds `authorization: <value>` to `ctx` if `value` is a valid gRPC metadata value (printable
// ASCII, 0x20-0x7E) and returns true; returns false and adds nothing otherwise (gRPC aborts the
// process on a call carrying an invalid value, so bytes from a client must pass through here).
bool AddAuthorizationMetadata(grpc::ClientContext& ctx, absl::string_view value);
// Adds `authorization: Bearer <token>` to `ctx` unless `token` is empty (or not printable ASCII:
// ReadTokenFile refuses such tokens).
void AddBearerToken(grpc::ClientContext& ctx, const std::string& token);

// The token in a file (surrounding whitespace trimmed); empty path = no token. NOT_FOUND if the
// file is missing, INVALID_ARGUMENT if it is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace loom

#endif  // LOOM_COMMON_GRPC_CREDENTIALS_H_
