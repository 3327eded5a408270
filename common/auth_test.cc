#include "common/auth.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(AuthTest, Sha256HexMatchesKnownVector) {
  // FIPS 180-2 test vector "abc".
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(AuthTest, BearerToken) {
  EXPECT_EQ(*BearerToken("Bearer abc123"), "abc123");
  EXPECT_EQ(*BearerToken("bearer   abc123 "), "abc123");
  EXPECT_EQ(BearerToken("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerToken("Basic dXNlcjpwdw==").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(BearerToken("Bearer ").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(AuthTest, AuthenticatesByTokenOrHash) {
  const std::string yaml = "tokens:\n"
                           "  - {tenant: team-a, token: alpha-token-1}\n"
                           "  - {tenant: ops, role: admin, token_sha256: " +
                           Sha256Hex("admin-token-9") + "}\n";
  auto auth = TokenAuthenticator::FromYaml(yaml);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->size(), 2u);
  auto a = auth->Authenticate("Bearer alpha-token-1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tenant, "team-a");
  EXPECT_FALSE(a->admin());
  auto b = auth->Authenticate("Bearer admin-token-9");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tenant, "ops");
  EXPECT_TRUE(b->admin());
  auto c = auth->Authenticate("Bearer alpha-token-2");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(c.status().message().find("alpha"), std::string::npos);  // never echo the token
  EXPECT_EQ(auth->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(AuthTest, AcceptsTopLevelJsonList) {
  auto auth = TokenAuthenticator::FromYaml(
      R"([{"tenant": "t1", "role": "user", "token": "0123456789"}])");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->Authenticate("Bearer 0123456789")->tenant, "t1");
}

TEST(AuthTest, RejectsMalformedFiles) {
  struct Case {
    const char* yaml;
    const char* expect;
  } cases[] = {
      {"tokens: []", "no tokens"},
      {"tokens:\n  - {tenant: Team_A, token: abcdefgh1}", "tokens[0].tenant"},
      {"tokens:\n  - {tenant: a, role: root, token: abcdefgh1}", "tokens[0].role"},
      {"tokens:\n  - {tenant: a}", "exactly one of"},
      {"tokens:\n  - {tenant: a, token: x, token_sha256: y}", "exactly one of"},
      {"tokens:\n  - {tenant: a, token_sha256: abc}", "64 hex"},
      {"tokens:\n  - {tenant: a, token: short}", "too short"},
      {"tokens:\n  - {tenant: a, tokn: abcdefgh1}", "tokens[0].tokn: unknown field"},
      {"tokens:\n  - {tenant: a, token: abcdefgh1}\n  - {tenant: b, token: abcdefgh1}",
       "tokens[1]: duplicate token"},
      {"hello: world", "want a list"},
  };
  for (const Case& c : cases) {
    auto auth = TokenAuthenticator::FromYaml(c.yaml, "f.yaml");
    ASSERT_FALSE(auth.ok()) << c.yaml;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(auth.status().message().find(c.expect), std::string::npos)
        << c.yaml << " -> " << auth.status();
  }
  EXPECT_EQ(TokenAuthenticator::FromFile("/nonexistent/tokens.yaml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

}  // namespace
}  // namespace loom
