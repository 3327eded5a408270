#include "common/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom {

bool IsWildcardAddress(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::StatusOr<std::string> AdvertisedAddress(absl::string_view bind_flag,
                                              const std::string& bind,
                                              absl::string_view advertise_flag,
                                              const std::string& advertise) {
  if (!advertise.empty()) {
    if (IsWildcardAddress(advertise)) {
      return absl::InvalidArgumentError(absl::StrCat(
          advertise_flag, ": '", advertise,
          "' is a wildcard address; advertise one that other hosts can dial"));
    }
    return advertise;
  }
  if (IsWildcardAddress(bind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        advertise_flag, " is required when ", bind_flag, " is the wildcard address '", bind,
        "' (other hosts cannot dial it)"));
  }
  return bind;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string ReplaceUrlHost(const std::string& url, absl::string_view host) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t start = scheme + 3;
  size_t end = start;
  if (end < url.size() && url[end] == '[') {
    end = url.find(']', end);
    end = end == std::string::npos ? url.size() : end + 1;
  }
  end = url.find_first_of(":/", end);
  if (end == std::string::npos) end = url.size();
  std::string h(host);
  if (absl::StrContains(h, ':') && !absl::StartsWith(h, "[")) h = absl::StrCat("[", h, "]");
  return absl::StrCat(url.substr(0, start), h, url.substr(end));
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& peer) {
  if (peer.empty()) return absl::InvalidArgumentError("empty peer address");
  std::string host = peer;
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", peer, "' does not resolve: ", ::gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::close(fd);
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw = local.ss_family == AF_INET6
                          ? static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
                          : static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) == nullptr) {
      error = std::strerror(errno);
      continue;
    }
    ::freeaddrinfo(found);
    return std::string(text);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("no route to '", peer, "': ", error));
}

absl::StatusOr<std::string> GlooBindAddress(const std::string& bind_address,
                                            const std::string& master_addr) {
  if (!bind_address.empty()) return bind_address;
  absl::StatusOr<std::string> local = LocalAddressToward(master_addr);
  if (!local.ok()) {
    return absl::Status(local.status().code(),
                        absl::StrCat("--master_addr: ", local.status().message()));
  }
  return local;
}

}  // namespace loom
