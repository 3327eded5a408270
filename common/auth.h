// File: common/auth.h
//
// Bearer-token authentication for Loom's gRPC API (no gRPC types here; services/scheduler glues
// it to call metadata). A tokens file maps tokens to a tenant and a role:
//
//   tokens:                                  # YAML (JSON is accepted too: it is YAML)
//     - tenant: team-a                       # [a-z0-9][a-z0-9-]{0,62}
//       role: user                           # user | admin (default user)
//       token_sha256: 9f86d081884c7d65...    # hex SHA-256 of the token (preferred), or
//     - tenant: ops
//       role: admin
//       token: s3cret-admin-token            # the token itself (test setups)
//
// A request carries `authorization: Bearer <token>`; Authenticate hashes the token and looks the
// hash up (equal-length constant-time comparison against every entry). A user acts within its
// tenant; an admin sees every tenant (and submits into its own).
#ifndef LOOM_COMMON_AUTH_H_
#define LOOM_COMMON_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// Tenant of every request when authentication is off.
inline constexpr char kDefaultTenant[] = "default";

enum class Role { kUser, kAdmin };

// Who made a request.
struct Caller {
  std::string tenant = kDefaultTenant;
  Role role = Role::kAdmin;  // unauthenticated mode: everyone sees everything, as before
  bool admin() const { return role == Role::kAdmin; }
};

// Lowercase hex SHA-256 of `data` (OpenSSL).
std::string Sha256Hex(absl::string_view data);

// The token in an `authorization` header value "Bearer <token>" (scheme case-insensitive);
// UNAUTHENTICATED if the value is empty or not a bearer token.
absl::StatusOr<std::string> BearerToken(absl::string_view authorization);

// Immutable after construction; thread-safe.
class TokenAuthenticator {
 public:
  // Parses a tokens file (format above). INVALID_ARGUMENT naming the entry and field for a
  // malformed file (unknown role, bad tenant name, missing token, duplicate token); NOT_FOUND if
  // the file does not exist.
  static absl::StatusOr<TokenAuthenticator> FromFile(const std::string& path);
  static absl::StatusOr<TokenAuthenticator> FromYaml(absl::string_view text,
                                                     absl::string_view source = "tokens");
  // One token for one caller (a service's own token, e.g. the workers' or the scheduler's).
  static TokenAuthenticator ForToken(absl::string_view token, Caller caller);

  // The caller for an `authorization` header value. UNAUTHENTICATED (never naming the token) if
  // it is missing, malformed or unknown.
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string sha256_hex;
    Caller caller;
  };
  std::vector<Entry> entries_;
};

// True if `a` and `b` are equal; the time taken depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace loom

#endif  // LOOM_COMMON_AUTH_H_
