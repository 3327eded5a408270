// Why hand-written: cpp-httplib 0.11 offers no hook between the socket and its header parser
// (its limits are compile-time macros, baked into Debian's split build, and none counts header
// fields), and its SocketStream is internal to the library. What it does offer is the virtual
// Server::process_and_close_socket and the protected Server::process_request(Stream&, ...):
// this file serves each connection as httplib's own loop does (v0.11.4, process_server_socket
// and SocketStream: same keep-alive count and timeouts, same 4 KiB read buffer per request,
// same liveness probe in is_writable), over a Stream that counts the header section as httplib
// reads it, one byte at a time (stream_line_reader). On a broken limit the stream reports end
// of input instead of the byte that broke it; httplib then fails the request as malformed (400)
// and its error handler, seeing CurrentHeaderLimitError(), answers 431 or 414 instead. The
// deadlines work the same way: every wait for bytes is cut at the request's deadline, and
// passing it breaks the 408 "limit" (the route reading a body sees it likewise).
// Upstream added a compile-time CPPHTTPLIB_HEADER_MAX_COUNT (100, a plain 400) in v0.22.0
// (2025); Debian 12 ships 0.11.4. With a library that has it, only the total-bytes limit, the
// 431 and the flags would still need this file.
#include "services/gateway/gateway_server.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace loom::gateway {
namespace {

using internal::HeaderLimitError;

// After a broken limit the client may still be sending its header section: closing a socket
// with unread bytes sends a reset, which can destroy the answer before the client reads it. So
// the gateway stops sending, then reads and drops what arrives (a 4 KiB buffer), for at most
// this long and this many bytes, before it closes (nginx's lingering close does the same, with
// 30 s / 5 s: shorter here because a pool thread waits meanwhile).
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kLingerBytes = 1 << 20;

int PollOne(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r;
}

int TimeoutMs(time_t sec, time_t usec) { return static_cast<int>(sec * 1000 + usec / 1000); }

using Clock = std::chrono::steady_clock;

Clock::duration ToClock(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

void IpAndPort(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return;
  }
  std::array<char, NI_MAXHOST> host{};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(),
                    static_cast<socklen_t>(host.size()), nullptr, 0, NI_NUMERICHOST) == 0) {
    ip = host.data();
  }
}

// One request's view of a connection (httplib makes one SocketStream per request likewise).
class LimitingSocketStream final : public httplib::Stream {
 public:
  LimitingSocketStream(int sock, const HeaderLimits& limits, int read_timeout_ms,
                       int write_timeout_ms)
      : sock_(sock),
        limits_(limits),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms),
        buffer_(kBufferSize),
        deadline_(Clock::now() + ToClock(limits.header_timeout)) {}

  // Within the read timeout, and not past the request's deadline.
  bool is_readable() const override {
    const int wait = WaitMs();
    return wait > 0 && PollOne(sock_, POLLIN, wait) > 0;
  }
  // As httplib's: writable within the write timeout, and the peer has not closed (the followed
  // log streams probe a quiet client with this).
  bool is_writable() const override {
    return PollOne(sock_, POLLOUT, write_timeout_ms_) > 0 && PeerAlive();
  }

  ssize_t read(char* ptr, size_t size) override {
    if (error_.http_status != 0 || line_ended_) return 0;
    const ssize_t n = ReadBuffered(ptr, size);
    if (n <= 0) return n;
    if (in_header_) {
      for (ssize_t i = 0; i < n && in_header_; ++i) {
        if (!Admit(ptr[i])) return i;  // 0 = end of input: httplib never sees the byte
      }
      return n;
    }
    // After the header section httplib reads lines (a chunk's size, a trailer field) one byte
    // at a time too, into a buffer that grows without bound: a run of single-byte reads longer
    // than a header line (plus one byte of chunk data) ends the input. Body data is read in
    // larger pieces.
    if (size != 1 || *ptr == '\n') {
      single_byte_run_ = 0;
    } else if (++single_byte_run_ > kMaxHeaderLineBytes + 1) {
      line_ended_ = true;
      return 0;
    }
    return n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      IpAndPort(addr, len, ip, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      IpAndPort(addr, len, ip, port);
    }
  }
  socket_t socket() const override { return sock_; }

  // The limit this request broke, or null.
  const HeaderLimitError* error() const { return error_.http_status != 0 ? &error_ : nullptr; }

 private:
  static constexpr size_t kBufferSize = 4096;

  // httplib's SocketStream::read: serves from a 4 KiB buffer, refilled by one recv.
  ssize_t ReadBuffered(char* ptr, size_t size) {
    if (offset_ < filled_) {
      const size_t n = std::min(size, filled_ - offset_);
      std::memcpy(ptr, buffer_.data() + offset_, n);
      offset_ += n;
      return static_cast<ssize_t>(n);
    }
    const int wait = WaitMs();
    if (wait <= 0 || PollOne(sock_, POLLIN, wait) <= 0) {
      // Past the deadline: end of input, so that httplib fails the request (the header section
      // or the body is then incomplete) and the 408 is answered in its place.
      if (Clock::now() < deadline_) return -1;
      Expire();
      return 0;
    }
    offset_ = filled_ = 0;
    if (size >= kBufferSize) return Recv(ptr, size);
    const ssize_t n = Recv(buffer_.data(), kBufferSize);
    if (n <= 0) return n;
    const size_t give = std::min(size, static_cast<size_t>(n));
    std::memcpy(ptr, buffer_.data(), give);
    offset_ = give;
    filled_ = static_cast<size_t>(n);
    return static_cast<ssize_t>(give);
  }

  ssize_t Recv(char* ptr, size_t size) {
    ssize_t n;
    do {
      n = ::recv(sock_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  // How long a read may wait for bytes: the read timeout, cut at the deadline (0 once past).
  int WaitMs() const {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, read_timeout_ms_));
  }

  // The deadline passed while the request was still being read: 408 naming the flag (unless
  // another limit was broken first).
  void Expire() {
    if (error_.http_status != 0) return;
    Break(408, in_header_
                   ? absl::StrCat("the request line and headers were not received within ",
                                  absl::FormatDuration(limits_.header_timeout),
                                  " (--header_timeout)")
                   : absl::StrCat("the request body was not received within ",
                                  absl::FormatDuration(limits_.body_timeout),
                                  " (--body_timeout)"));
  }

  bool PeerAlive() const {
    const int ready = PollOne(sock_, POLLIN, 0);
    if (ready == 0) return true;
    if (ready < 0) return errno != EBADF;
    char byte;
    return ::recv(sock_, &byte, 1, MSG_PEEK) > 0;
  }

  // Accounts one byte of the header section; false (error_ set) if it would break a limit.
  // The section is the request line, then lines up to the first line that is exactly CRLF:
  // httplib's read_headers ends it there only (a bare LF line is skipped, and counted here).
  bool Admit(char c) {
    ++line_bytes_;
    ++total_bytes_;
    if (line_bytes_ > kMaxHeaderLineBytes) {
      if (lines_ == 0) {
        return Break(414, absl::StrCat("the request line is longer than ", kMaxHeaderLineBytes,
                                       " bytes"));
      }
      return Break(431, absl::StrCat("header field line ", lines_, " is longer than ",
                                     kMaxHeaderLineBytes, " bytes"));
    }
    const bool blank_line = c == '\n' && line_bytes_ == 2 && previous_ == '\r';
    // lines_ - 1 fields are complete: this line would be field number lines_.
    if (c == '\n' && lines_ > 0 && !blank_line && lines_ > limits_.max_count) {
      return Break(431, absl::StrCat("the request has more than ", limits_.max_count,
                                     " header fields (--max_header_count)"));
    }
    if (total_bytes_ > limits_.max_bytes) {
      return Break(431, absl::StrCat("the request line and headers are longer than ",
                                     limits_.max_bytes, " bytes (--max_header_bytes)"));
    }
    previous_ = c;
    if (c == '\n') {
      if (lines_ > 0 && blank_line) {
        in_header_ = false;
        deadline_ = Clock::now() + ToClock(limits_.body_timeout);
      }
      ++lines_;
      line_bytes_ = 0;
    }
    return true;
  }

  bool Break(int status, std::string message) {
    error_.http_status = status;
    error_.message = std::move(message);
    return false;
  }

  const int sock_;
  const HeaderLimits limits_;
  const int read_timeout_ms_;
  const int write_timeout_ms_;
  std::vector<char> buffer_;
  size_t offset_ = 0;
  size_t filled_ = 0;
  Clock::time_point deadline_;  // of the header section, then (once it ended) of the body

  bool in_header_ = true;
  size_t lines_ = 0;  // complete lines so far, the request line included
  size_t line_bytes_ = 0;
  size_t total_bytes_ = 0;
  char previous_ = 0;
  size_t single_byte_run_ = 0;
  bool line_ended_ = false;
  HeaderLimitError error_;
};

// The stream of the request the calling thread is serving, set for the scope of a
// CurrentStream.
thread_local const LimitingSocketStream* current_stream = nullptr;

struct CurrentStream {
  explicit CurrentStream(const LimitingSocketStream* stream) { current_stream = stream; }
  ~CurrentStream() { current_stream = nullptr; }
  CurrentStream(const CurrentStream&) = delete;
  CurrentStream& operator=(const CurrentStream&) = delete;
};

// Waits (at most `timeout_sec`) until the client sends its next request or closes.
bool AwaitRequest(int sock, time_t timeout_sec) {
  return PollOne(sock, POLLIN, static_cast<int>(timeout_sec * 1000)) > 0;
}

// Stops sending, then drops what the client still sends for at most kLingerTime / kLingerBytes.
void Linger(int sock) {
  ::shutdown(sock, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + kLingerTime;
  size_t dropped = 0;
  std::array<char, 4096> sink;
  while (dropped < kLingerBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || PollOne(sock, POLLIN, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(sock, sink.data(), sink.size(), 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

}  // namespace

GatewayServer::GatewayServer(HeaderLimits limits)
    : limits_{std::max<size_t>(1, limits.max_count), std::max<size_t>(1, limits.max_bytes),
              std::max(absl::Milliseconds(1), limits.header_timeout),
              std::max(absl::Milliseconds(1), limits.body_timeout)} {}

bool GatewayServer::process_and_close_socket(socket_t sock) {
  bool ret = false;
  bool broken = false;
  for (size_t left = keep_alive_max_count_;
       left > 0 && svr_sock_ != INVALID_SOCKET && AwaitRequest(sock, keep_alive_timeout_sec_);
       --left) {
    LimitingSocketStream strm(sock, limits_, TimeoutMs(read_timeout_sec_, read_timeout_usec_),
                              TimeoutMs(write_timeout_sec_, write_timeout_usec_));
    bool closed = false;
    {
      CurrentStream current(&strm);
      ret = process_request(strm, /*close_connection=*/left == 1, closed, nullptr);
    }
    broken = strm.error() != nullptr;
    if (!ret || closed || broken) break;
  }
  // A request that failed (!ret) includes one answered without reading its body, which the
  // gateway then closes on purpose (internal::WriteHttpErrorAndClose): linger for it too, so
  // that the answer is not lost to a reset while the client is still sending.
  if (broken || !ret) Linger(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

namespace internal {

const HeaderLimitError* CurrentHeaderLimitError() {
  return current_stream != nullptr ? current_stream->error() : nullptr;
}

}  // namespace internal
}  // namespace loom::gateway
