// Keep-alive client pool to the backend.
//
// The one thing this file must get right is Failure: the gateway releases a claim only
// when the backend cannot have seen the request (connect_failed), and treats everything
// after the first byte left us as "outcome unknown". So the classification follows what
// was written, never what the error happened to be called.
//
// There is no retry here on purpose. Even a reused keep-alive connection that the backend
// closed at the same instant we wrote is ambiguous, and only the gateway (which knows
// whether the request is protected by a claim) may decide to try again.
//
// Per-request costs are kept low on purpose, since every proxied request pays them: a
// pooled connection keeps its read buffer and its deadline timer, the deadline is lazy
// (common/deadline.hpp), and the request head is written by hand in one buffer
// rather than through Beast's serializer.
#include "common/deadline.hpp"
#include "common/http_head.hpp"
#include "common/io_now.hpp"
#include "common/message_parser.hpp"
#include "upstream/client.hpp"
#include "upstream/response.hpp"
#include "upstream/tls.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

namespace idem::upstream {
namespace {

using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<tcp::socket>;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// A backend whose certificate fails verification fails every connect: one warning per
// this period per pool says so without a line per request.
constexpr Millis kTlsWarningPeriod{10000};
// Above this, a pooled connection gives its buffers back before going idle.
constexpr std::size_t kKeepBufferBytes = 64 * 1024;

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// Host header value: IPv6 literals need their brackets back (RFC 3986 §3.2.2).
std::string host_header(const std::string& bare_host, std::uint16_t port) {
  const bool v6_literal = bare_host.find(':') != std::string::npos;
  return (v6_literal ? "[" + bare_host + "]" : bare_host) + ":" + std::to_string(port);
}

// Whether an idle keep-alive connection can still carry a request. The backend may have
// closed it (idle timeout, restart) while it sat in the pool; writing into such a socket
// "succeeds" and the failure only shows up as a reset afterwards, indistinguishable from
// a backend that crashed mid-request. A non-blocking peek tells the two apart up front:
// EOF or an error means closed; unsolicited bytes (e.g. a 408 the backend sent on its own)
// mean the connection is out of step. Only "nothing to read yet" is healthy.
bool still_usable(tcp::socket& socket, TlsStream* tls) noexcept {
  // Decrypted bytes the TLS layer holds past the response are stray bytes too.
  if (tls && SSL_pending(tls->native_handle()) > 0) return false;
  char probe;
  for (;;) {
    const auto n = ::recv(socket.native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// The request line and header fields exactly as Beast's serializer writes them:
// "METHOD target HTTP/1.1\r\n", each field "Name: value\r\n" in order, then "\r\n".
void append_request_head(std::string& out, const Request& req) {
  const auto method = req.method_string();
  const auto target = req.target();
  const unsigned version = req.version();
  out.append(method.data(), method.size());
  out += ' ';
  out.append(target.data(), target.size());
  out += " HTTP/";
  out += static_cast<char>('0' + version / 10);
  out += '.';
  out += static_cast<char>('0' + version % 10);
  out += "\r\n";
  http_head::append_fields(out, req.base());
}

// One connection to the backend and what it keeps from one exchange to the next.
//
// The deadline is lazy (common/deadline.hpp), like the client sessions': exchanges on a
// pooled connection arm later and later deadlines, so the timer fires about once per
// response_timeout instead of being set and cancelled for every write and read. A passed
// deadline shuts the socket down, so whatever step of the exchange is running (or starts
// next) fails at once.
class Connection {
 public:
  // With `tls`, the connection is a TLS stream over its own socket (ssl_stream, whose
  // writes are coalesced into one record); `plain` then stays unused.
  Connection(const asio::any_io_executor& ex, const ClientTls* tls)
      : plain(ex),
        tls_stream(tls ? std::make_unique<TlsStream>(ex, *tls->context) : nullptr),
        deadline_(ex, [this] {
          error_code ignored;
          socket().cancel(ignored);
          socket().shutdown(tcp::socket::shutdown_both, ignored);
        }) {}

  tcp::socket& socket() noexcept { return tls_stream ? tls_stream->next_layer() : plain; }

  void arm(SteadyClock::time_point deadline) { deadline_.arm(deadline); }
  void disarm() noexcept { deadline_.disarm(); }
  bool timed_out() const noexcept { return deadline_.expired(); }

  // Closes the socket and cancels the deadline's pending wait.
  void close() noexcept {
    deadline_.stop();
    error_code ignored;
    socket().close(ignored);
  }

  tcp::socket plain;
  std::unique_ptr<TlsStream> tls_stream;
  beast::flat_buffer buffer;  // bytes read past a response (none when pooled)
  std::string head;           // the request head being written
  SteadyClock::time_point since;  // when it went idle

 private:
  LazyDeadline deadline_;
};

using ConnectionPtr = std::shared_ptr<Connection>;

}  // namespace

struct Pool::Impl {
  Impl(asio::any_io_executor ex, PoolOptions opts)
      : executor(std::move(ex)),
        options(std::move(opts)),
        bare_host(strip_brackets(options.host)),
        host_value(host_header(bare_host, options.port)),
        sweeper(executor) {
    error_code ec;
    const auto address = asio::ip::make_address(bare_host, ec);
    if (!ec) {
      // An address literal never needs a lookup (or a re-lookup after a failure).
      literal = tcp::endpoint(address, options.port);
      endpoints.push_back(*literal);
    }
  }

  ~Impl() { close_all_idle(); }

  asio::awaitable<error_code> ensure_endpoints();
  asio::awaitable<ConnectionPtr> connect(SteadyClock::time_point deadline);
  asio::awaitable<bool> handshake(Connection& conn, const ClientTls& tls);
  asio::awaitable<void> read_response(ConnectionPtr& conn, bool head, Outcome& out);
  ConnectionPtr take_idle();
  void give_back(ConnectionPtr conn);
  void drop_expired(SteadyClock::time_point now);
  void close_all_idle() noexcept;
  void schedule_sweep();

  asio::any_io_executor executor;
  PoolOptions options;
  std::string bare_host;
  std::string host_value;
  std::optional<tcp::endpoint> literal;
  std::vector<tcp::endpoint> endpoints;
  // Most recently used at the back: LIFO reuse keeps a few connections hot and lets the
  // rest age out, instead of spreading load thinly so that none ever becomes idle.
  std::vector<ConnectionPtr> idle;
  bool shut_down = false;
  asio::steady_timer sweeper;
  bool sweep_scheduled = false;
  // Tells a sweeper callback that outlived the pool not to touch it.
  std::shared_ptr<char> alive = std::make_shared<char>();
  SteadyClock::time_point last_tls_warning{};
};

asio::awaitable<error_code> Pool::Impl::ensure_endpoints() {
  if (!endpoints.empty()) co_return error_code{};
  // The resolver runs getaddrinfo on a background thread, so the event loop never blocks;
  // its duration is bounded by the system resolver's own timeouts, not ours.
  tcp::resolver resolver(executor);
  auto [ec, results] = co_await resolver.async_resolve(bare_host, std::to_string(options.port),
                                                        use_tuple);
  if (ec) co_return ec;
  if (results.empty()) co_return asio::error::host_not_found;
  endpoints.clear();
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  co_return error_code{};
}

void Pool::Impl::drop_expired(SteadyClock::time_point now) {
  // The vector is ordered by `since` (oldest first), so expired ones form a prefix.
  const auto first_live = std::find_if(idle.begin(), idle.end(), [&](const ConnectionPtr& c) {
    return now - c->since < options.idle_ttl;
  });
  for (auto it = idle.begin(); it != first_live; ++it) (*it)->close();
  idle.erase(idle.begin(), first_live);
}

ConnectionPtr Pool::Impl::take_idle() {
  drop_expired(SteadyClock::now());
  while (!idle.empty()) {
    ConnectionPtr conn = std::move(idle.back());
    idle.pop_back();
    if (still_usable(conn->socket(), conn->tls_stream.get())) return conn;
    conn->close();
  }
  return nullptr;
}

void Pool::Impl::give_back(ConnectionPtr conn) {
  if (shut_down || options.max_idle == 0) {
    conn->close();
    return;
  }
  if (idle.size() >= options.max_idle) {
    // Full: the oldest idle connection is the least likely to be wanted again.
    idle.front()->close();
    idle.erase(idle.begin());
  }
  conn->disarm();
  if (conn->buffer.capacity() > kKeepBufferBytes) conn->buffer = beast::flat_buffer();
  if (conn->head.capacity() > kKeepBufferBytes) std::string().swap(conn->head);
  conn->since = SteadyClock::now();
  idle.push_back(std::move(conn));
  schedule_sweep();
}

// Without traffic nobody would look at the idle list, and connections the backend closed
// would sit in CLOSE_WAIT until the next request. One timer per pool walks it at the
// oldest connection's expiry.
void Pool::Impl::schedule_sweep() {
  if (sweep_scheduled || idle.empty()) return;
  sweep_scheduled = true;
  sweeper.expires_at(idle.front()->since + options.idle_ttl);
  sweeper.async_wait([this, token = std::weak_ptr<char>(alive)](const error_code& ec) {
    if (token.expired()) return;  // the pool is gone; `this` dangles
    sweep_scheduled = false;
    if (ec) return;
    drop_expired(SteadyClock::now());
    schedule_sweep();
  });
}

void Pool::Impl::close_all_idle() noexcept {
  for (auto& c : idle) c->close();
  idle.clear();
  sweeper.cancel();
}

Pool::Pool(asio::any_io_executor executor, PoolOptions options)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(options))) {}

Pool::~Pool() = default;

void Pool::shutdown() {
  impl_->shut_down = true;
  impl_->close_all_idle();
}

std::size_t Pool::idle_count() const noexcept { return impl_->idle.size(); }

namespace {

// We speak HTTP/1.1 on this hop whatever the client spoke (RFC 9110 §6.2: an intermediary
// sends its own version), and we frame the body ourselves.
void prepare_request(Request& request, const std::string& host_value) {
  request.version(11);
  if (request.find(http::field::host) == request.end()) request.set(http::field::host, host_value);
  request.erase(http::field::transfer_encoding);
  request.erase(http::field::content_length);
  // Not prepare_payload(): it throws on a TRACE with a body, and send() must not throw.
  // Methods that define a body get a length even when it is empty (RFC 9110 §8.6).
  const auto method = request.method();
  if (!request.body().empty() || method == http::verb::post || method == http::verb::put ||
      method == http::verb::patch) {
    request.content_length(request.body().size());
  }
  request.keep_alive(true);
}

// Writes the request. Failure::none when all of it went out; a write that failed before
// the kernel accepted one byte means the backend cannot have seen the request, which is
// as safe to release as a refused connect.
asio::awaitable<Failure> write_request(Connection& conn, const Request& request) {
  conn.head.clear();
  append_request_head(conn.head, request);
  const std::array<asio::const_buffer, 2> request_bytes{asio::buffer(conn.head),
                                                        asio::buffer(request.body())};
  // A plain connection's kernel buffer nearly always takes the whole request: sent here,
  // without the pass of the event loop an Asio write's completion costs (common/io_now.hpp).
  error_code wec;
  std::size_t written = 0;
  if (!conn.tls_stream) written = io_now::send_now(conn.plain.native_handle(), request_bytes, wec);
  if (!wec && written < asio::buffer_size(request_bytes)) {
    auto [aec, n] = conn.tls_stream
                        ? co_await asio::async_write(*conn.tls_stream, request_bytes, use_tuple)
                        : co_await asio::async_write(conn.plain, io_now::after(request_bytes, written),
                                                     use_tuple);
    wec = aec;
    written += n;
  }
  if (!wec && !conn.timed_out()) co_return Failure::none;
  if (written == 0) co_return Failure::connect_failed;
  co_return conn.timed_out() ? Failure::timeout : Failure::broken;
}

}  // namespace

// A new connection to the backend within the connect timeout (and the exchange's
// deadline), or nullptr when none could be made.
asio::awaitable<ConnectionPtr> Pool::Impl::connect(SteadyClock::time_point deadline) {
  if (const auto ec = co_await ensure_endpoints()) co_return nullptr;
  // A copy: another exchange may clear the shared list while this connect is running.
  const std::vector<tcp::endpoint> candidates = endpoints;
  const auto tls = options.tls ? options.tls() : nullptr;
  auto conn = std::make_shared<Connection>(executor, tls.get());
  conn->arm(std::min(deadline, SteadyClock::now() + options.connect_timeout));
  // The condition stops the walk through the candidates once the deadline passed.
  const auto in_time = [c = conn.get()](const error_code&, const tcp::endpoint&) {
    return !c->timed_out();
  };
  auto [ec, endpoint] = co_await asio::async_connect(conn->socket(), candidates, in_time, use_tuple);
  if (ec || conn->timed_out()) {
    conn->close();
    // The name may now point elsewhere (a redeployed backend): look it up again next time.
    if (!literal) endpoints.clear();
    co_return nullptr;
  }
  error_code ignored;
  conn->socket().set_option(tcp::no_delay(true), ignored);
  // The handshake belongs to the connect: under its deadline, and a failure sent nothing.
  if (tls && !co_await handshake(*conn, *tls)) {
    conn->close();
    co_return nullptr;
  }
  co_return conn;
}

asio::awaitable<bool> Pool::Impl::handshake(Connection& conn, const ClientTls& tls) {
  if (!prepare_connection(conn.tls_stream->native_handle(), tls)) co_return false;
  auto [ec] = co_await conn.tls_stream->async_handshake(asio::ssl::stream_base::client, use_tuple);
  if (!ec && !conn.timed_out()) co_return true;
  const auto now = SteadyClock::now();
  if (now - last_tls_warning >= kTlsWarningPeriod) {
    last_tls_warning = now;
    spdlog::warn("TLS handshake with the upstream {} (name {}) failed: {}", host_value, tls.server_name,
                 conn.timed_out() ? std::string("timed out")
                                  : handshake_failure(conn.tls_stream->native_handle(), ec));
  }
  co_return false;
}

// Reads the final response (interim 1xx skipped) into `out`, and gives the connection
// back to the pool when the exchange ended at a boundary both sides agree on
// (upstream/response.hpp decides; this drives the reads). The header is read first, so its
// size and framing are checked before the body (check_header), then the rest.
asio::awaitable<void> Pool::Impl::read_response(ConnectionPtr& conn, bool head, Outcome& out) {
  const ResponseLimits limits{options.max_response_header, options.max_response_body};
  conn->buffer.max_size(read_buffer_cap(limits));
  for (;;) {
    ResponseParser parser(limits.max_header);
    prepare_parser(parser, limits, head);
    // What the buffer already holds (an answer pipelined behind a 1xx, or all of it after
    // an earlier read) is parsed at once; Beast's reads only for bytes still to come
    // (common/io_now.hpp). The same for the body below.
    error_code hec;
    std::size_t hn = 0;
    if (!io_now::parse_buffered(parser, conn->buffer, io_now::HeaderDone{}, hec, hn)) {
      auto [rec, rn] = conn->tls_stream
                           ? co_await http::async_read_header(*conn->tls_stream, conn->buffer, parser, use_tuple)
                           : co_await http::async_read_header(conn->plain, conn->buffer, parser, use_tuple);
      hec = rec;
      hn += rn;
    }
    if (conn->timed_out()) {
      out.failure = Failure::timeout;
      co_return;
    }
    out.failure = hec ? classify_read_error(hec) : check_header(parser, hn, limits, head);
    if (out.failure != Failure::none) co_return;
    parser.eager(true);  // as http::async_read sets it
    error_code rec;
    std::size_t parsed = 0;
    if (!io_now::parse_buffered(parser, conn->buffer, io_now::MessageDone{}, rec, parsed)) {
      auto [aec, n] = conn->tls_stream
                          ? co_await http::async_read(*conn->tls_stream, conn->buffer, parser, use_tuple)
                          : co_await http::async_read(conn->plain, conn->buffer, parser, use_tuple);
      rec = aec;
    }
    // A complete answer is not discarded for a deadline that fired meanwhile: after a
    // stall (a process stopped, then continued, past its deadline) the expired timer can
    // run before the read's completion although the whole answer had arrived. Had the read
    // needed the socket, the deadline's shutdown would have failed it. The connection is
    // not pooled after a deadline either way.
    if (rec) {
      out.failure = conn->timed_out() ? Failure::timeout : classify_read_error(rec);
      co_return;
    }
    const Verdict verdict = judge(parser, head, conn->buffer.size());
    if (verdict.interim) continue;
    out.failure = verdict.failure;
    if (out.failure != Failure::none) co_return;
    out.response = parser.release();
    if (verdict.reusable && !conn->timed_out()) give_back(std::move(conn));  // conn is null now
    co_return;
  }
}

asio::awaitable<Outcome> Pool::send(Request request) {
  Impl& pool = *impl_;
  const auto deadline = SteadyClock::now() + pool.options.response_timeout;
  Outcome out;
  prepare_request(request, pool.host_value);

  // Whatever way this exchange ends, a connection that is not back in the pool is closed
  // (which also releases its deadline timer).
  ConnectionPtr conn = pool.take_idle();
  struct CloseUnlessPooled {
    ConnectionPtr& conn;
    ~CloseUnlessPooled() {
      if (conn) conn->close();
    }
  } close_unless_pooled{conn};

  if (conn) {
    out.reused_connection = true;
  } else if (conn = co_await pool.connect(deadline); !conn) {
    out.failure = Failure::connect_failed;
    co_return out;
  }

  conn->arm(deadline);
  out.failure = co_await write_request(*conn, request);
  if (out.failure != Failure::none) co_return out;
  co_await pool.read_response(conn, request.method() == http::verb::head, out);
  co_return out;
}

const char* to_string(Failure f) noexcept {
  switch (f) {
    case Failure::none: return "none";
    case Failure::connect_failed: return "connect_failed";
    case Failure::timeout: return "timeout";
    case Failure::broken: return "broken";
    case Failure::response_too_large: return "response_too_large";
    case Failure::bad_response: return "bad_response";
  }
  return "unknown";
}

}  // namespace idem::upstream
