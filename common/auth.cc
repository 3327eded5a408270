#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <yaml-cpp/yaml.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace loom {
namespace {

bool ValidTenant(const std::string& t) {
  if (t.empty() || t.size() > 63) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c == '-' && i > 0);
    if (!ok) return false;
  }
  return true;
}

bool IsLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> BearerToken(absl::string_view authorization) {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.empty()) {
    return absl::UnauthenticatedError("missing credentials: send 'authorization: Bearer <token>'");
  }
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("authorization: not a Bearer token");
  }
  absl::string_view token = absl::StripAsciiWhitespace(v.substr(7));
  if (token.empty()) return absl::UnauthenticatedError("authorization: empty Bearer token");
  return std::string(token);
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return FromYaml(text, path);
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::FromYaml(absl::string_view text,
                                                                absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  YAML::Node list = root.IsMap() ? root["tokens"] : root;
  if (!list.IsDefined() || !list.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": want a list of {tenant, role, token_sha256|token} under 'tokens'"));
  }
  TokenAuthenticator auth;
  std::set<std::string> seen;
  try {
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node& e = list[i];
      const std::string where = absl::StrCat(source, ": tokens[", i, "]");
      if (!e.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a mapping"));
      for (const auto& kv : e) {
        const std::string key = kv.first.as<std::string>();
        if (key != "tenant" && key != "role" && key != "token" && key != "token_sha256") {
          return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": unknown field"));
        }
      }
      Entry entry;
      entry.caller.tenant = e["tenant"] ? e["tenant"].as<std::string>() : "";
      if (!ValidTenant(entry.caller.tenant)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".tenant: want 1-63 of [a-z0-9-] starting with a letter or digit, got '",
            entry.caller.tenant, "'"));
      }
      const std::string role = e["role"] ? e["role"].as<std::string>() : "user";
      if (role == "user") {
        entry.caller.role = Role::kUser;
      } else if (role == "admin") {
        entry.caller.role = Role::kAdmin;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".role: want user or admin, got '", role, "'"));
      }
      const bool has_token = e["token"].IsDefined();
      const bool has_hash = e["token_sha256"].IsDefined();
      if (has_token == has_hash) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": exactly one of token_sha256 and token is required"));
      }
      if (has_hash) {
        entry.sha256_hex = absl::AsciiStrToLower(e["token_sha256"].as<std::string>());
        if (!IsLowerHex64(entry.sha256_hex)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".token_sha256: want 64 hex digits"));
        }
      } else {
        const std::string token = e["token"].as<std::string>();
        if (token.size() < 8) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".token: too short (want at least 8 characters)"));
        }
        entry.sha256_hex = Sha256Hex(token);
      }
      if (!seen.insert(entry.sha256_hex).second) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate token"));
      }
      auth.entries_.push_back(std::move(entry));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  if (auth.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  }
  return auth;
}

TokenAuthenticator TokenAuthenticator::ForToken(absl::string_view token, Caller caller) {
  TokenAuthenticator a;
  a.entries_.push_back(Entry{Sha256Hex(token), std::move(caller)});
  return a;
}

absl::StatusOr<Caller> TokenAuthenticator::Authenticate(absl::string_view authorization) const {
  ASSIGN_OR_RETURN(std::string token, BearerToken(authorization));
  const std::string hash = Sha256Hex(token);
  const Caller* found = nullptr;
  for (const Entry& e : entries_) {  // no early exit: timing does not tell which entry matched
    if (ConstantTimeEquals(e.sha256_hex, hash)) found = &e.caller;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  return *found;
}

}  // namespace loom
