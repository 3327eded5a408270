// Addresses a Loom daemon binds and advertises, and the address a trainer rank's Gloo transport
// binds to (docs/operations.md "Bind and advertise addresses").
//
// A daemon binds the address it is given (--host: an interface address, or a wildcard such as
// 0.0.0.0 to listen on every interface) and advertises the address it is given
// (--advertise_address: what other hosts dial; required when the bind address is a wildcard,
// because 0.0.0.0 names no host). Nothing here special-cases loopback: 127.0.0.1 is as good an
// address as any other when it is the one given, and is never substituted for one.
//
// Thread-safety: every function is stateless and thread-safe. Addresses are IPv4/IPv6 literals
// or host names, without a port unless a name says otherwise.
#ifndef LOOM_COMMON_NET_ADDRESS_H_
#define LOOM_COMMON_NET_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// True for "", "0.0.0.0", "::" and "[::]": bind addresses that listen on every interface and
// cannot be dialled by another host.
bool IsWildcardAddress(absl::string_view host);

// The address a daemon advertises: `advertise` when set, else `bind` when it is a concrete
// address. INVALID_ARGUMENT naming `advertise_flag` when `advertise` is a wildcard, or when it
// is empty and `bind` (named by `bind_flag`) is a wildcard.
absl::StatusOr<std::string> AdvertisedAddress(absl::string_view bind_flag,
                                              const std::string& bind,
                                              absl::string_view advertise_flag,
                                              const std::string& advertise);

// "host:port", with brackets around an IPv6 literal ("[fd00::1]:50051").
std::string JoinHostPort(absl::string_view host, int port);

// `url` ("scheme://HOST:PORT/path", HOST possibly a bracketed IPv6 literal) with HOST replaced
// by `host` (bracketed if IPv6): a daemon's bound metrics URL as other hosts dial it. `url`
// unchanged if it has no "://".
std::string ReplaceUrlHost(const std::string& url, absl::string_view host);

// The local address the kernel would use as the source of a packet to `peer` (a host name or
// literal): a UDP socket connect()ed to peer:9 and read back with getsockname() (no packet is
// sent). It is the interface on the route to `peer`, so 127.0.0.1 for a loopback peer and the
// namespace's or host's own address for a remote one. INVALID_ARGUMENT if `peer` is empty or
// does not resolve; UNAVAILABLE if there is no route to it.
absl::StatusOr<std::string> LocalAddressToward(const std::string& peer);

// The address a trainer rank's Gloo device binds to: `bind_address` when set (the worker passes
// its node's advertised address), else LocalAddressToward(master_addr) (a rank started by hand).
// Errors name --master_addr (LocalAddressToward's codes).
absl::StatusOr<std::string> GlooBindAddress(const std::string& bind_address,
                                            const std::string& master_addr);

}  // namespace loom

#endif  // LOOM_COMMON_NET_ADDRESS_H_
