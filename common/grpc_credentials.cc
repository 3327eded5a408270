#include "common/grpc_credentials.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_file.empty() ? "tls_cert" : "tls_key", ": required when the other TLS file is set"));
  }
  ASSIGN_OR_RETURN(std::string cert, ReadFile(cert_file));
  ASSIGN_OR_RETURN(std::string key, ReadFile(key_file));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  ASSIGN_OR_RETURN(std::string ca, ReadFile(ca_file));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca;
  return grpc::SslCredentials(options);
}

absl::StatusOr<Caller> CallerFromMetadata(const grpc::ServerContextBase& context,
                                          const TokenAuthenticator* auth) {
  if (auth == nullptr) return Caller{};
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  return auth->Authenticate(it == md.end() ? absl::string_view()
                                           : absl::string_view(it->second.data(), it->second.size()));
}

bool AddAuthorizationMetadata(grpc::ClientContext& ctx, absl::string_view value) {
  for (char c : value) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  ctx.AddMetadata("authorization", std::string(value));
  return true;
}

void AddBearerToken(grpc::ClientContext& ctx, const std::string& token) {
  if (!token.empty()) AddAuthorizationMetadata(ctx, absl::StrCat("Bearer ", token));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty token file"));
  for (char c : token) {
    if (c <= 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the token must be printable ASCII without spaces"));
    }
  }
  return token;
}

}  // namespace loom
