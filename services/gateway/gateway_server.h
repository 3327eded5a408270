// loom-gateway's HTTP server: cpp-httplib's Server, with the request's header section bounded
// while it is read, before httplib stores it and before anything looks at it (the token check
// included). httplib 0.11 bounds neither the number of header fields nor their total size, and
// keeps every field of a request in memory (10,000 headers were answered 200; unauthenticated
// requests carrying millions of them grew the gateway from 92 MB to 958 MB resident: issue 42).
// Its own per-line limit (CPPHTTPLIB_HEADER_MAX_LENGTH) is compiled into Debian's library and
// answers a plain 400.
//
// Limits (HeaderLimits; loom-gateway --max_header_count, --max_header_bytes):
//   * at most `max_count` header field lines per request (every line between the request line
//     and the blank line counts, also one httplib would skip);
//   * at most `max_bytes` bytes for the request line, the field lines and the blank line,
//     CRLFs included;
//   * at most kMaxHeaderLineBytes bytes for any one line (CRLF included), the library's own
//     compiled-in limit, so that the library never meets a line it would refuse with a bare 400.
// After the header section, a line that httplib reads of a chunked body (a chunk's size line, a
// trailer field) is bounded by kMaxHeaderLineBytes too: the body then ends there, and the route
// reading it answers 400 (httplib read such a line whole into memory, however long).
// A request over a header limit is answered, when the gateway's error handler is installed
// (JobGateway::Register), 431 Request Header Fields Too Large (414 URI Too Long for a request
// line over kMaxHeaderLineBytes) with the gateway's JSON error body naming the limit, and its
// connection is closed after the answer: the rest of its header section is never read into
// memory, and never parsed as a next request. Memory per connection is thus bounded by the
// limits whatever a client sends.
//
// Deadlines (HeaderLimits; loom-gateway --header_timeout, --body_timeout): the read timeout
// (5 s) bounds only the wait for the next byte, so a client sending one header byte every few
// seconds held a pool thread for as long as it liked (8 such connections took every thread of
// a default gateway: breakit H1). Each request now has
//   * `header_timeout` to send its request line and header section, counted from its first
//     byte (the idle time before that is httplib's keep-alive timeout, 5 s, on every request of
//     a connection, the first included): past it the gateway stops reading, answers 408 Request
//     Timeout (the gateway's JSON error body naming the flag) and closes the connection;
//   * `body_timeout` to send its body once the header section is complete (a route that reads
//     a body, after the token check, answers 408 likewise when it passes).
// A slow client thus holds a thread for at most keep-alive + header + body timeouts (+ the 1 s
// lingering close), and requests queued behind it are served after that.
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_SERVER_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_SERVER_H_

#include <httplib.h>

#include <cstddef>
#include <string>

#include "absl/time/time.h"

namespace loom::gateway {

// The longest line of a request's header section, in bytes with its CRLF: cpp-httplib's
// CPPHTTPLIB_HEADER_MAX_LENGTH and CPPHTTPLIB_REQUEST_URI_MAX_LENGTH as Debian's library is built
// (8192, checked by gateway_header_limits_test). nginx's large_client_header_buffers default,
// 8 KiB, is the same.
inline constexpr size_t kMaxHeaderLineBytes = 8192;

struct HeaderLimits {
  // Header field lines per request (> 0). Envoy's max_headers_count and Apache's
  // LimitRequestFields default to 100 too; Loom's clients send fewer than 10.
  size_t max_count = 100;
  // Bytes of the request line plus all header field lines and the blank line, CRLFs included
  // (> 0). Envoy's max_request_headers_kb defaults to 60 KiB; nginx's buffers hold 32 KiB. A
  // bearer token is under 1 KiB.
  size_t max_bytes = 64 << 10;
  // Time from a request's first byte to the end of its header section (> 0). nginx's
  // client_header_timeout defaults to 60 s, but Loom's clients (loomctl, scripts, the UI proxy)
  // send a few hundred bytes in one write: 10 s leaves a slow or lossy link several
  // retransmissions, and frees a thread held by a trickling client 6 times sooner.
  absl::Duration header_timeout = absl::Seconds(10);
  // Time from the end of the header section to the end of the body, on routes that read one
  // (> 0). Bodies are at most --max_body_bytes (4 MiB; a job spec is a few KiB): 60 s is the
  // 4 MiB at about 70 KB/s.
  absl::Duration body_timeout = absl::Seconds(60);
};

// Thread-safe as httplib::Server is (configure before listening; stop() from any thread).
class GatewayServer : public httplib::Server {
 public:
  explicit GatewayServer(HeaderLimits limits = HeaderLimits());
  const HeaderLimits& header_limits() const { return limits_; }

 private:
  // httplib's per-connection loop (keep-alive, timeouts) over a stream that enforces `limits_`.
  bool process_and_close_socket(socket_t sock) override;

  const HeaderLimits limits_;
};

namespace internal {

// A limit the request being answered broke: the HTTP status to answer (431, 414, or 408 for a
// deadline) and a message naming the limit.
struct HeaderLimitError {
  int http_status = 0;
  std::string message;
};

// The limit broken by the request that the calling thread is answering, or null. Valid inside
// httplib's handlers for that request (the error handler, the logger): a GatewayServer reads,
// and answers, each request of a connection on one thread.
const HeaderLimitError* CurrentHeaderLimitError();

}  // namespace internal
}  // namespace loom::gateway

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_SERVER_H_
