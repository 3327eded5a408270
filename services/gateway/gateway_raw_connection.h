// Test support: a raw HTTP/1.1 connection on loopback, for what httplib's client would not send
// (a header that is not UTF-8, two Content-Length headers, 10,000 header fields) and for
// reading the gateway's answers byte for byte. Not thread-safe: one connection per thread.
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_RAW_CONNECTION_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_RAW_CONNECTION_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace loom::gateway {

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// A loopback connection that sends bytes exactly as given (what httplib's client would not
// send: a header that is not UTF-8, two Content-Length headers) and reads responses. Every read
// gives up after 20 s (SO_RCVTIMEO), and so does every send (SO_SNDTIMEO), so a gateway that
// never answers, or stops reading, fails the test instead of hanging it.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    timeval timeout{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Close();
  }
  ~RawConnection() { Close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (fd_ >= 0 && sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return sent == bytes.size();
  }

  // Waits at most `timeout_ms` for the gateway to send something (or close); true if it did,
  // or if bytes not yet consumed are already here.
  bool WaitReadable(int timeout_ms) {
    if (pos_ < in_.size() || closed_) return true;
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0;
  }

  // Ends the sending side (shutdown SHUT_WR): the gateway reads end of input after what was sent.
  bool FinishSending() { return fd_ >= 0 && ::shutdown(fd_, SHUT_WR) == 0; }

  // Reads until `text` arrived after what earlier calls consumed; false on end of stream or
  // the receive timeout.
  bool ReadUntil(const std::string& text) {
    while (in_.find(text, pos_) == std::string::npos) {
      if (!ReadMore()) return false;
    }
    return true;
  }

  // ReadUntil(text), then consumes everything up to the end of `text`.
  bool Skip(const std::string& text) {
    if (!ReadUntil(text)) return false;
    pos_ = in_.find(text, pos_) + text.size();
    return true;
  }

  // True when the gateway closes the connection (end of stream, or a reset: closing a socket
  // with unread bytes sends one) before the receive timeout, and sent nothing more.
  bool ReadToEof() {
    const size_t before = in_.size();
    while (ReadMore()) {
    }
    return closed_ && in_.size() == before;
  }

  // The next response: its headers and a Content-Length body.
  absl::StatusOr<RawResponse> ReadResponse() {
    if (!ReadUntil("\r\n\r\n")) {
      return absl::DeadlineExceededError(absl::StrCat("no response headers: '", in_, "'"));
    }
    const size_t header_end = in_.find("\r\n\r\n", pos_);
    std::vector<std::string> lines =
        absl::StrSplit(in_.substr(pos_, header_end - pos_), "\r\n");
    std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
    RawResponse resp;
    if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &resp.status)) {
      return absl::InternalError(absl::StrCat("bad status line: ", lines[0]));
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      resp.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    size_t length = 0;
    if (!absl::SimpleAtoi(resp.headers["content-length"], &length)) length = 0;
    const size_t body_start = header_end + 4;
    while (in_.size() < body_start + length) {
      if (!ReadMore()) {
        return absl::DeadlineExceededError(absl::StrCat("incomplete body: '", in_, "'"));
      }
    }
    resp.body = in_.substr(body_start, length);
    pos_ = body_start + length;
    return resp;
  }

 private:
  bool ReadMore() {
    if (fd_ < 0 || closed_) return false;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    // A timeout is EAGAIN; anything else ends the connection.
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed_ = true;
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string in_;
  size_t pos_ = 0;
  bool closed_ = false;
};

// Sends `request` on a fresh connection to 127.0.0.1:`port`; the answer (an empty one after a
// test failure), and with `closed` whether the gateway then closed the connection (its FIN
// follows such an answer at once; a connection kept open is seen only at the keep-alive
// timeout, 5 s).
inline RawResponse Exchange(int port, const std::string& request, bool* closed = nullptr) {
  RawConnection c(port);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(c.Send(request));
  absl::StatusOr<RawResponse> resp = c.ReadResponse();
  EXPECT_TRUE(resp.ok()) << resp.status();
  if (closed != nullptr) *closed = c.ReadToEof();
  return resp.ok() ? *resp : RawResponse();
}

}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_RAW_CONNECTION_H_
