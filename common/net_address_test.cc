// Address selection of the daemons and trainer ranks (common/net_address.h). The route lookups
// are checked against the interface addresses getifaddrs(3) reports, an independent source.
#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

// IPv4 addresses of this host's (or namespace's) interfaces that are up, other than 127/8.
std::vector<std::string> NonLoopbackIpv4() {
  std::vector<std::string> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) out.push_back(text);
  }
  ::freeifaddrs(all);
  return out;
}

TEST(NetAddressTest, Wildcards) {
  EXPECT_TRUE(IsWildcardAddress(""));
  EXPECT_TRUE(IsWildcardAddress("0.0.0.0"));
  EXPECT_TRUE(IsWildcardAddress("::"));
  EXPECT_TRUE(IsWildcardAddress("[::]"));
  EXPECT_FALSE(IsWildcardAddress("127.0.0.1"));
  EXPECT_FALSE(IsWildcardAddress("10.213.7.2"));
  EXPECT_FALSE(IsWildcardAddress("node-3.example"));
}

TEST(NetAddressTest, AdvertisesTheGivenAddressElseAConcreteBindAddress) {
  EXPECT_EQ(*AdvertisedAddress("--host", "0.0.0.0", "--advertise_address", "10.213.7.2"),
            "10.213.7.2");
  EXPECT_EQ(*AdvertisedAddress("--host", "10.213.7.9", "--advertise_address", "10.213.7.2"),
            "10.213.7.2");  // the given advertise address wins, even over a concrete bind
  EXPECT_EQ(*AdvertisedAddress("--host", "10.213.7.9", "--advertise_address", ""), "10.213.7.9");
  EXPECT_EQ(*AdvertisedAddress("--host", "127.0.0.1", "--advertise_address", ""), "127.0.0.1");
}

TEST(NetAddressTest, WildcardWithoutAdvertiseAddressIsRefusedNamingTheFlag) {
  absl::StatusOr<std::string> a = AdvertisedAddress("--host", "0.0.0.0", "--advertise_address", "");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("--advertise_address is required"), std::string::npos)
      << a.status();
  EXPECT_NE(a.status().message().find("--host"), std::string::npos) << a.status();
  a = AdvertisedAddress("--host", "10.0.0.1", "--advertise_address", "0.0.0.0");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("--advertise_address: '0.0.0.0'"), std::string::npos)
      << a.status();
}

TEST(NetAddressTest, JoinHostPortBracketsIpv6) {
  EXPECT_EQ(JoinHostPort("10.213.7.1", 50051), "10.213.7.1:50051");
  EXPECT_EQ(JoinHostPort("fd00::1", 50051), "[fd00::1]:50051");
  EXPECT_EQ(JoinHostPort("[fd00::1]", 50051), "[fd00::1]:50051");
  EXPECT_EQ(JoinHostPort("node-3", 7), "node-3:7");
}

TEST(NetAddressTest, ReplaceUrlHost) {
  EXPECT_EQ(ReplaceUrlHost("http://0.0.0.0:41235/metrics", "10.213.7.1"),
            "http://10.213.7.1:41235/metrics");
  EXPECT_EQ(ReplaceUrlHost("http://[::]:41235/metrics", "fd00::1"),
            "http://[fd00::1]:41235/metrics");
  EXPECT_EQ(ReplaceUrlHost("http://node:8080", "10.0.0.2"), "http://10.0.0.2:8080");
  EXPECT_EQ(ReplaceUrlHost("not a url", "10.0.0.2"), "not a url");
}

TEST(NetAddressTest, LocalAddressTowardLoopbackIsLoopback) {
  EXPECT_EQ(*LocalAddressToward("127.0.0.1"), "127.0.0.1");
}

// Toward one of this host's own non-loopback addresses the kernel's source is that address,
// not 127.0.0.1 (the selection no longer assumes loopback).
TEST(NetAddressTest, LocalAddressTowardAnInterfaceAddressIsThatAddress) {
  const std::vector<std::string> mine = NonLoopbackIpv4();
  if (mine.empty()) GTEST_SKIP() << "no non-loopback IPv4 interface here";
  for (const std::string& a : mine) {
    absl::StatusOr<std::string> local = LocalAddressToward(a);
    ASSERT_TRUE(local.ok()) << a << ": " << local.status();
    EXPECT_EQ(*local, a);
  }
}

TEST(NetAddressTest, LocalAddressTowardBadPeerIsInvalidArgument) {
  EXPECT_EQ(LocalAddressToward("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalAddressToward("no-such-host.invalid").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NetAddressTest, GlooBindAddressPrefersTheGivenAddress) {
  EXPECT_EQ(*GlooBindAddress("10.213.7.3", "10.213.7.2"), "10.213.7.3");
  EXPECT_EQ(*GlooBindAddress("", "127.0.0.1"), "127.0.0.1");
  absl::StatusOr<std::string> bad = GlooBindAddress("", "no-such-host.invalid");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--master_addr"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace loom
