// The client-facing listener and its per-connection sessions.
//
// Threading: a Server lives on one io_context that one thread runs; every member of the
// listener and its sessions is touched only from that thread. The public control calls
// (stop_accepting, close_idle, the destructor) may come from any thread and are dispatched
// onto it. Only the ConnectionGauge and the active-connection counter are shared.
//
// Deadlines: the session keeps a plain tcp::socket (under Beast's ssl_stream on a TLS
// listener) and its own lazy deadline (common/deadline.hpp) rather than using
// beast::tcp_stream, because tcp_stream closes the socket when a deadline passes and a
// request that timed out mid-way should still get its 408 before the connection closes.
// A passed deadline acts on the TCP socket under the TLS layer, so both kinds time out
// the same way.
#include "common/http_head.hpp"
#include "server/server.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <unordered_set>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <spdlog/spdlog.h>

#include "common/deadline.hpp"
#include "common/io_now.hpp"
#include "common/message_parser.hpp"
#include "server/framing.hpp"
#include "server/request_head.hpp"
#include "server/tls.hpp"

namespace idem::server {
namespace detail {
namespace {

using tcp = asio::ip::tcp;
// Beast's stream coalesces a gathered write into one TLS record (Asio's alone would
// encrypt and send each buffer on its own).
using TlsStream = beast::ssl_stream<tcp::socket>;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Read size while discarding input during a lingering close.
constexpr std::size_t kDiscardReadSize = 4096;
// The first read of a request: one typical API request header (and small body) in one go;
// the header parser grows the buffer when it needs more.
constexpr std::size_t kIdleReadSize = 1024;
// Above this, an idle connection's buffer is released before waiting for the next request.
constexpr std::size_t kIdleBufferCap = 4096;
// After a response that ends the connection we stop sending and keep reading for a while
// before closing: closing with unread input makes the kernel send a RST, and a RST can
// destroy the response the client has not read yet (typically a 413 sent while the client
// is still uploading). Bounded in time and bytes so a client cannot hold us here.
constexpr Millis kLingerTime{2000};
constexpr std::size_t kLingerMaxBytes = 1u << 20;
// accept() failing for lack of descriptors would otherwise spin the loop at 100% CPU.
constexpr Millis kAcceptBackoff{50};
// While a body is read, the buffer holds at most the metadata budget (max_header_bytes)
// plus this much unparsed input: room for the chunk-size digits and line ends around
// extensions and trailer fields that are within the budget.
constexpr std::size_t kChunkLineSlack = 256;
constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();

std::atomic<std::uint64_t> g_next_connection_id{1};

std::uint32_t clamp_u32(std::size_t v) noexcept {
  return static_cast<std::uint32_t>(std::min<std::size_t>(v, std::numeric_limits<std::uint32_t>::max()));
}

bool is_http_error(const error_code& ec) noexcept {
  return ec.category() == http::make_error_code(http::error::bad_target).category();
}

// A parse failure that is the client's fault (as opposed to EOF or a reset), so it
// deserves a 400 rather than a silent close.
bool is_malformed(const error_code& ec) noexcept {
  return is_http_error(ec) && ec != http::error::end_of_stream &&
         ec != http::error::partial_message;
}

bool expects_continue(const http::request_header<>& h) {
  const auto it = h.find(http::field::expect);
  return it != h.end() && beast::iequals(it->value(), "100-continue");
}

// Only an explicit "Connection: close" from the handler counts: res.keep_alive() would
// also read "no" into a bare HTTP/1.0 response that merely did not mention keep-alive.
bool asks_to_close(const Response& res) {
  const auto it = res.find(http::field::connection);
  if (it == res.end()) return false;
  for (const auto token : http::token_list{it->value()}) {
    if (beast::iequals(token, "close")) return true;
  }
  return false;
}

// The path without the query, for logs: a query string may carry credentials.
std::string_view path_of(std::string_view target) noexcept {
  return target.substr(0, target.find('?'));
}

// The response must be framed by what we are about to send, whatever the handler copied
// from elsewhere (a Transfer-Encoding from the backend describes a body it has already
// been decoded from).
void frame_response(Response& res, http::verb method) {
  res.erase(http::field::transfer_encoding);
  const unsigned status = res.result_int();
  if (status / 100 == 1 || status == 204) {
    res.body().clear();  // RFC 9110 §8.6: no Content-Length on 1xx and 204
    res.erase(http::field::content_length);
    return;
  }
  if (status == 304) {
    res.body().clear();  // a Content-Length here describes the cached representation
    return;
  }
  if (method == http::verb::head) {
    // A handler may set the length a GET would have had; keep it, send no body.
    if (!res.has_content_length()) res.content_length(res.body().size());
    res.body().clear();
    return;
  }
  res.content_length(res.body().size());
}

// The status line and header fields exactly as Beast's serializer writes them:
// "HTTP/x.y NNN reason\r\n", each field "Name: value\r\n" in order, then "\r\n".
void append_response_head(std::string& out, const Response& res) {
  const unsigned version = res.version();
  const unsigned code = res.result_int();
  out += "HTTP/";
  out += static_cast<char>('0' + version / 10);
  out += '.';
  out += static_cast<char>('0' + version % 10);
  out += ' ';
  out += static_cast<char>('0' + code / 100);
  out += static_cast<char>('0' + code / 10 % 10);
  out += static_cast<char>('0' + code % 10);
  out += ' ';
  const auto reason = res.reason();  // the stored phrase, else the standard one
  out.append(reason.data(), reason.size());
  out += "\r\n";
  http_head::append_fields(out, res.base());
}

asio::ip::address listen_address(const settings::Endpoint& endpoint) {
  std::string host = endpoint.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "*") return asio::ip::address_v4::any();
  error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (!ec) return address;
  // A host name: resolved once at start-up, before the event loop serves anything, so a
  // blocking lookup is acceptable here and keeps start() synchronous as declared.
  asio::io_context lookup_ctx;
  tcp::resolver resolver(lookup_ctx);
  const auto results = resolver.resolve(host, "", tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    throw boost::system::system_error(ec ? ec : asio::error::host_not_found,
                                      "cannot resolve listen address '" + host + "'");
  }
  return results.begin()->endpoint().address();
}

void log_exception(std::string_view what, std::uint64_t id, std::exception_ptr e) noexcept {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    spdlog::error("{} {} ended by an exception: {}", what, id, ex.what());
  } catch (...) {
    spdlog::error("{} {} ended by an unknown exception", what, id);
  }
}

}  // namespace

// What the listener needs of a session of either kind (plain or TLS): only the graceful
// close is called through it, never anything per request.
class SessionControl {
 public:
  virtual void request_close() = 0;

 protected:
  ~SessionControl() = default;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& ioc, ListenerOptions options, LimitsSource limits, Handler handler,
           std::shared_ptr<ConnectionGauge> gauge, RejectHook on_reject)
      : ioc_(ioc),
        options_(std::move(options)),
        limits_(std::move(limits)),
        handler_(std::move(handler)),
        gauge_(gauge ? std::move(gauge) : std::make_shared<ConnectionGauge>()),
        on_reject_(std::move(on_reject)),
        acceptor_(ioc) {
    // Pre-serialized once: refusing a connection over the limit must cost next to nothing.
    std::ostringstream out;
    auto res = make_problem(http::status::service_unavailable, "too_many_connections",
                            "Too Many Connections",
                            "the proxy is at its connection limit; retry shortly", 11, false);
    res.set(http::field::retry_after, "1");
    out << res;
    overload_response_ = out.str();
  }

  void start();
  void stop_accepting();
  void close_idle();

  std::uint16_t port() const noexcept { return port_.load(std::memory_order_relaxed); }
  std::size_t active() const noexcept { return active_.load(std::memory_order_relaxed); }

  settings::Limits limits() const { return limits_ ? limits_() : settings::Limits{}; }
  const ListenerOptions& options() const noexcept { return options_; }
  const Handler& handler() const noexcept { return handler_; }
  bool draining() const noexcept { return draining_; }

  // Never lets a hook failure take the session down: the hook is observability only.
  void report(const RequestContext& ctx, int status, std::string_view code) const noexcept {
    if (!on_reject_) return;
    try {
      on_reject_(ctx, status, code);
    } catch (const std::exception& e) {
      spdlog::error("reject hook failed: {}", e.what());
    } catch (...) {
      spdlog::error("reject hook failed");
    }
  }

  void attach(SessionControl* s) {
    sessions_.insert(s);
    active_.fetch_add(1, std::memory_order_relaxed);
  }
  void detach(SessionControl* s) noexcept {
    sessions_.erase(s);
    active_.fetch_sub(1, std::memory_order_relaxed);
    gauge_->open.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  static asio::awaitable<void> accept_loop(std::shared_ptr<Listener> self);
  void admit(tcp::socket socket);
  template <class Stream, class... TlsContext>
  void spawn(tcp::socket socket, TlsContext&... ctx);
  void refuse_overloaded(tcp::socket& socket);

  asio::io_context& ioc_;
  const ListenerOptions options_;
  const LimitsSource limits_;
  const Handler handler_;
  const std::shared_ptr<ConnectionGauge> gauge_;
  const RejectHook on_reject_;
  tcp::acceptor acceptor_;
  std::string overload_response_;
  std::atomic<std::uint16_t> port_{0};
  std::atomic<std::size_t> active_{0};
  bool draining_ = false;
  std::unordered_set<SessionControl*> sessions_;
};

// One connection. Stream is tcp::socket (plain HTTP) or TlsStream; both instantiations
// share every line of the request path, so plain HTTP pays nothing for TLS.
template <class Stream>
class Session final : public SessionControl {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  // The caller has already counted this connection in the gauge; detach() uncounts it.
  // A TLS session also gets the context of the listener's current certificate.
  template <class... TlsContext>
  Session(std::shared_ptr<Listener> owner, tcp::socket connection, TlsContext&... ctx)
      : owner_(std::move(owner)),
        stream_(std::move(connection), ctx...),
        deadline_(socket().get_executor(),
                  [this] {
                    interrupt(deadline_kind_ == Deadline::write ? tcp::socket::shutdown_both
                                                                : tcp::socket::shutdown_receive);
                  }),
        id_(g_next_connection_id.fetch_add(1, std::memory_order_relaxed)) {
    error_code ec;
    peer_ = socket().remote_endpoint(ec);
    if (!ec) {
      try {
        peer_address_ = peer_.address().to_string();
      } catch (const std::exception&) {
        // left empty: the gateway formats the address itself
      }
    }
    // Responses go out in one write; without this a pipelined or 100-continue exchange
    // can stall on Nagle + delayed ACK for 40ms.
    socket().set_option(tcp::no_delay(true), ec);
    owner_->attach(this);
  }
  ~Session() { owner_->detach(this); }  // NOLINT: SessionControl's destructor is protected
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  static asio::awaitable<void> run(std::shared_ptr<Session> self) {
    struct Finish {
      Session& session;
      ~Finish() { session.finish(); }
    } finish{*self};
    if constexpr (kTls) {
      if (!co_await self->handshake()) co_return;
    }
    co_await self->serve();
  }

  std::uint64_t id() const noexcept { return id_; }

  // Graceful shutdown: an idle connection closes now, a busy one after its response.
  void request_close() override {
    close_requested_ = true;
    if (idle_) interrupt(tcp::socket::shutdown_receive);
  }

 private:
  enum class Deadline { read, write };

  asio::awaitable<bool> handshake();
  asio::awaitable<void> serve();
  asio::awaitable<bool> wait_for_request(const settings::Limits& limits);
  asio::awaitable<bool> read_head(http_parse::MessageParser<true>& parser,
                                  const settings::Limits& limits, RequestContext& ctx);
  asio::awaitable<bool> read_body(http_parse::MessageParser<true>& parser,
                                  const settings::Limits& limits, const RequestContext& ctx);
  asio::awaitable<bool> respond(Request& req, const RequestContext& ctx,
                                const settings::Limits& limits);
  asio::awaitable<Response> call_handler(Request& req, const RequestContext& ctx);
  asio::awaitable<bool> write(Response& res, Millis timeout);
  asio::awaitable<void> refuse(http::status status, std::string_view code, std::string_view title,
                               std::string_view detail, unsigned version,
                               const RequestContext& ctx, Millis write_timeout);
  asio::awaitable<void> refuse_body(const error_code& ec, http_parse::Overflow overflow,
                                    const settings::Limits& limits, unsigned version,
                                    const RequestContext& ctx);
  asio::awaitable<void> lingering_close();

  void arm(Millis after, Deadline kind) {
    deadline_kind_ = kind;
    deadline_.arm_after(after);
  }
  void disarm() noexcept { deadline_.disarm(); }
  bool timed_out() const noexcept { return deadline_.expired(); }
  // The session is over: no deadline may fire any more, and the timer lets go of it.
  void finish() noexcept;
  void interrupt(tcp::socket::shutdown_type how) noexcept;
  void close_now() noexcept {
    error_code ignored;
    socket().close(ignored);
  }
  tcp::socket& socket() noexcept { return beast::get_lowest_layer(stream_); }

  const std::shared_ptr<Listener> owner_;
  Stream stream_;
  // Every request arms and disarms a deadline three or four times (idle, header, body,
  // write); a lazy one (common/deadline.hpp) fires about once per header_timeout in
  // steady keep-alive traffic, not per phase. A passed deadline interrupts the socket.
  LazyDeadline deadline_;
  Deadline deadline_kind_ = Deadline::read;
  beast::flat_buffer buffer_;
  std::string head_;  // the response head being written (reused across requests)
  tcp::endpoint peer_;
  std::string peer_address_;  // formatted once: every forwarded request names it
  std::vector<std::string> client_uris_;  // TLS: the verified client certificate's URI SANs
  const std::uint64_t id_;
  bool idle_ = false;
  bool close_requested_ = false;
};

// ---------------------------------------------------------------------------------------
// Listener

void Listener::start() {
  const tcp::endpoint endpoint(listen_address(options_.endpoint), options_.endpoint.port);
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  if (options_.reuse_port) {
    // Each worker owns an acceptor on the same port and the kernel spreads connections
    // across them, so no accept lock or cross-thread hand-off is needed.
    const int on = 1;
    if (::setsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0) {
      throw boost::system::system_error(error_code(errno, boost::system::system_category()),
                                        "setsockopt(SO_REUSEPORT)");
    }
  }
  acceptor_.bind(endpoint);
  acceptor_.listen(options_.backlog);
  port_.store(acceptor_.local_endpoint().port(), std::memory_order_relaxed);
  asio::co_spawn(ioc_, accept_loop(shared_from_this()),
                 [](std::exception_ptr e) { log_exception("listener", 0, e); });
}

void Listener::stop_accepting() {
  asio::dispatch(ioc_, [self = shared_from_this()] {
    // Closing (not just cancelling) releases the port, so a replacement process can bind
    // it and new connects are refused by the kernel instead of queueing unanswered.
    error_code ignored;
    self->acceptor_.close(ignored);
    self->draining_ = true;
  });
}

void Listener::close_idle() {
  asio::dispatch(ioc_, [self = shared_from_this()] {
    for (SessionControl* s : self->sessions_) s->request_close();
  });
}

asio::awaitable<void> Listener::accept_loop(std::shared_ptr<Listener> self) {
  asio::steady_timer backoff(self->ioc_);
  for (;;) {
    auto [ec, socket] = co_await self->acceptor_.async_accept(use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !self->acceptor_.is_open()) co_return;
      // EMFILE/ENFILE/ENOBUFS and aborted handshakes: the listener itself is fine.
      spdlog::warn("accept on port {} failed: {}", self->port(), ec.message());
      backoff.expires_after(kAcceptBackoff);
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    // A connection accepted just before stop_accepting() is still served (its response
    // will carry Connection: close): the kernel has already completed its handshake.
    try {
      self->admit(std::move(socket));
    } catch (const std::exception& e) {
      spdlog::error("cannot start a session: {}", e.what());
    }
    if (!self->acceptor_.is_open()) co_return;
  }
}

void Listener::admit(tcp::socket socket) {
  // Count first, then compare: two workers accepting at the same time cannot both slip
  // under the limit. Zero means unlimited.
  const auto max = limits().max_connections;
  const auto before = gauge_->open.fetch_add(1, std::memory_order_acq_rel);
  if (max != 0 && before >= max) {
    gauge_->open.fetch_sub(1, std::memory_order_acq_rel);
    refuse_overloaded(socket);
    return;
  }
  if (options_.tls) {
    std::shared_ptr<asio::ssl::context> ctx;
    try {
      ctx = options_.tls();
    } catch (...) {
      gauge_->open.fetch_sub(1, std::memory_order_acq_rel);
      throw;
    }
    spawn<TlsStream>(std::move(socket), *ctx);
  } else {
    spawn<tcp::socket>(std::move(socket));
  }
}

template <class Stream, class... TlsContext>
void Listener::spawn(tcp::socket socket, TlsContext&... ctx) {
  std::shared_ptr<Session<Stream>> session;
  try {
    session = std::make_shared<Session<Stream>>(shared_from_this(), std::move(socket), ctx...);
  } catch (...) {
    gauge_->open.fetch_sub(1, std::memory_order_acq_rel);  // ~Session never ran
    throw;
  }
  const auto id = session->id();
  asio::co_spawn(ioc_, Session<Stream>::run(std::move(session)),
                 [id](std::exception_ptr e) { log_exception("connection", id, e); });
}

// Over the limit we answer without reading the request: a single non-blocking write of a
// canned 503 into a fresh socket's empty send buffer, then close. It spends no coroutine,
// timer or buffer on a connection we are refusing because resources are short. A client
// that already sent its request may see a reset instead of the 503; both mean "retry".
void Listener::refuse_overloaded(tcp::socket& socket) {
  error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  report(RequestContext{peer, SteadyClock::now(), 0}, 503, "too_many_connections");
  socket.non_blocking(true, ec);
  // A TLS client would read plain bytes as a broken handshake: it just sees the close.
  if (!ec && !options_.tls) socket.write_some(asio::buffer(overload_response_), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

// ---------------------------------------------------------------------------------------
// Session

template <class Stream>
void Session<Stream>::finish() noexcept { deadline_.stop(); }

// cancel() aborts the operation in flight, but a Beast composed operation may be between
// two steps with nothing in flight; the shutdown makes the next step fail too (a read sees
// EOF, a write EPIPE). Shutting down only the receive side keeps the socket writable for
// the 408 that follows a read timeout.
template <class Stream>
void Session<Stream>::interrupt(tcp::socket::shutdown_type how) noexcept {
  error_code ignored;
  socket().cancel(ignored);
  socket().shutdown(how, ignored);
}

template <class Stream>
asio::awaitable<bool> Session<Stream>::write(Response& res, Millis timeout) {
  arm(timeout, Deadline::write);
  error_code ec;
  if (res.chunked()) {
    // Never produced here (frame_response removes Transfer-Encoding); Beast frames it.
    auto [wec, n] = co_await http::async_write(stream_, res, use_tuple);
    ec = wec;
  } else {
    // Beast's serializer walks the message through a generic buffer-sequence view whose
    // iteration alone showed up as several percent of a pass-through request; the same
    // bytes, a head built in a reused string, go out in one gathered write.
    head_.clear();
    append_response_head(head_, res);
    const std::array<asio::const_buffer, 2> buffers{asio::buffer(head_), asio::buffer(res.body())};
    // On a plain socket the kernel nearly always takes the whole answer at once: sent
    // here, the coroutine goes on without a pass of the event loop (common/io_now.hpp).
    std::size_t sent = 0;
    if constexpr (!kTls) {
      sent = io_now::send_now(socket().native_handle(), buffers, ec);
    }
    if (!ec && sent < asio::buffer_size(buffers)) {
      auto [wec, n] = co_await asio::async_write(stream_, io_now::after(buffers, sent), use_tuple);
      ec = wec;
    }
    if (head_.capacity() > kIdleBufferCap) std::string().swap(head_);
  }
  disarm();
  co_return !ec && !timed_out();
}

template <class Stream>
asio::awaitable<void> Session<Stream>::refuse(http::status status, std::string_view code,
                                      std::string_view title, std::string_view detail,
                                      unsigned version, const RequestContext& ctx,
                                      Millis write_timeout) {
  // Every refusal closes the connection: after a framing or limit error the position of
  // the next request in the stream is unknown, and guessing is how smuggling starts.
  auto res = make_problem(status, code, title, detail, version, /*keep_alive=*/false);
  owner_->report(ctx, static_cast<int>(status), code);
  if (co_await write(res, write_timeout)) {
    co_await lingering_close();
  } else {
    close_now();
  }
}

// The answer to a body read that failed or timed out, in the contract's order: the
// deadline, the body limit, the chunk metadata budget (common/message_parser.hpp), then
// anything else the parser refused; a client that simply went away gets no answer.
template <class Stream>
asio::awaitable<void> Session<Stream>::refuse_body(const error_code& ec, http_parse::Overflow overflow,
                                           const settings::Limits& limits, unsigned version,
                                           const RequestContext& ctx) {
  if (timed_out()) {
    co_await refuse(http::status::request_timeout, "request_timeout", "Request Timeout",
                    "the request body was not received in time", version, ctx,
                    limits.body_timeout);
  } else if (ec == http::error::body_limit) {
    co_await refuse(http::status::payload_too_large, "request_too_large", "Content Too Large",
                    "the request body exceeds " + std::to_string(limits.max_request_body) +
                        " bytes",
                    version, ctx, limits.body_timeout);
  } else if (overflow == http_parse::Overflow::trailer) {
    co_await refuse(http::status::request_header_fields_too_large, "headers_too_large",
                    "Request Header Fields Too Large",
                    "the request trailer exceeds " + std::to_string(limits.max_header_bytes) +
                        " bytes",
                    version, ctx, limits.body_timeout);
  } else if (overflow == http_parse::Overflow::chunk_extensions) {
    co_await refuse(http::status::bad_request, "bad_request", "Bad Request",
                    "the chunk extensions exceed " + std::to_string(limits.max_header_bytes) +
                        " bytes",
                    version, ctx, limits.body_timeout);
  } else if (is_malformed(ec)) {
    co_await refuse(http::status::bad_request, "bad_request", "Bad Request",
                    "malformed request body", version, ctx, limits.body_timeout);
  } else {
    close_now();
  }
}

template <class Stream>
asio::awaitable<void> Session<Stream>::lingering_close() {
  error_code ec;
  if constexpr (kTls) {
    // close_notify, then OpenSSL reads and discards what the client still sends until its
    // own close_notify or EOF: the same lingering, bounded in time the same way.
    // Its error is of no use: the connection is closed either way.
    arm(kLingerTime, Deadline::write);
    co_await stream_.async_shutdown(use_tuple);
    disarm();
    close_now();
    co_return;
  }
  socket().shutdown(tcp::socket::shutdown_send, ec);
  if (!ec) {
    arm(kLingerTime, Deadline::read);
    std::size_t discarded = 0;
    while (!timed_out() && discarded < kLingerMaxBytes) {
      buffer_.clear();
      auto [rec, n] = co_await socket().async_read_some(buffer_.prepare(kDiscardReadSize), use_tuple);
      if (rec) break;  // EOF: the client has read everything and closed
      discarded += n;
    }
    disarm();
  }
  close_now();
}

// TLS: the handshake, under the header timeout (a client that connects and says nothing
// is held no longer than one that sends half a header). A failure ends the connection
// without an answer: there is no channel to send one on. Logged at debug, since scanners
// and health probes fail handshakes all day.
template <class Stream>
asio::awaitable<bool> Session<Stream>::handshake() {
  if constexpr (kTls) {
    arm(owner_->limits().header_timeout, Deadline::write);
    auto [ec] = co_await stream_.async_handshake(asio::ssl::stream_base::server, use_tuple);
    disarm();
    if (ec || timed_out()) {
      spdlog::debug("connection {}: TLS handshake with {} failed: {}", id_, peer_address_,
                    timed_out() ? std::string("timed out") : ec.message());
      close_now();
      co_return false;
    }
    client_uris_ = verified_peer_uris(stream_.native_handle());
  }
  co_return true;
}

template <class Stream>
asio::awaitable<Response> Session<Stream>::call_handler(Request& req, const RequestContext& ctx) {
  std::string failure;
  try {
    co_return co_await owner_->handler()(req, ctx);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "unknown exception";
  }
  // A bug in one request must not cost the client its connection or the process its
  // other requests; the request was read completely, so the stream is still in sync.
  spdlog::error("connection {}: handler failed on {} {}: {}", id_, std::string(req.method_string()),
                std::string(path_of(req.target())), failure);
  owner_->report(ctx, 500, "internal_error");
  co_return make_problem(http::status::internal_server_error, "internal_error",
                         "Internal Server Error", "the request could not be processed",
                         req.version(), req.keep_alive());
}

// One request after another, as its phases in order: the idle wait, the head (header,
// framing and head rules), the body, then the handler and the response. Each phase arms
// its own deadline next to the read it guards and answers its own refusals; a phase that
// returns false has ended the connection (refused, or the client went away).
template <class Stream>
asio::awaitable<void> Session<Stream>::serve() {
  for (;;) {
    // Read per request so a reload applies to the next request on open connections too.
    const settings::Limits limits = owner_->limits();
    if (!co_await wait_for_request(limits)) break;

    RequestContext ctx{peer_, SteadyClock::now(), id_, peer_address_, client_uris_};
    // Chunk extensions and trailer fields share a budget of max_header_bytes, and trailer
    // fields never join the header (common/message_parser.hpp).
    http_parse::MessageParser<true> parser(limits.max_header_bytes);
    if (!co_await read_head(parser, limits, ctx)) break;
    if (!co_await read_body(parser, limits, ctx)) break;

    Request req = parser.release();
    if (!co_await respond(req, ctx, limits)) break;
  }
  close_now();
}

// 1. Wait for the first bytes of the next request under the idle timeout. Pipelined bytes
//    already buffered count as "arrived". This is a read, not a wait for readability: Asio
//    re-arms epoll (an epoll_ctl) for every readiness wait, while a read that follows a
//    read which drained the socket goes straight to the next readiness event, so reading
//    saves a system call per request. The cost is a small buffer held by each idle
//    keep-alive connection; it is capped here so a connection that once carried a large
//    request does not keep that memory.
template <class Stream>
asio::awaitable<bool> Session<Stream>::wait_for_request(const settings::Limits& limits) {
  if (buffer_.size() != 0) co_return true;
  if (close_requested_) co_return false;
  if (buffer_.capacity() > kIdleBufferCap) buffer_.shrink_to_fit();
  idle_ = true;
  arm(limits.idle_timeout, Deadline::read);
  auto [ec, n] = co_await stream_.async_read_some(buffer_.prepare(kIdleReadSize), use_tuple);
  disarm();
  idle_ = false;
  buffer_.commit(n);
  // Nothing had started: an idle timeout or shutdown ends silently, and so does a client
  // that closed (EOF) between requests.
  co_return !(ec || timed_out() || close_requested_);
}

// 2. The header, under the header timeout and size limit. The body limit is lifted here:
//    Beast would otherwise report an oversized Content-Length before we had a chance to
//    refuse ambiguous framing, and the contract ranks 400 above 413.
// 3. Framing, decided on the header alone, before any body byte is consumed; then the
//    head rules.
template <class Stream>
asio::awaitable<bool> Session<Stream>::read_head(http_parse::MessageParser<true>& parser,
                                         const settings::Limits& limits, RequestContext& ctx) {
  parser.header_limit(clamp_u32(limits.max_header_bytes));
  parser.body_limit(boost::none);
  arm(limits.header_timeout, Deadline::read);
  // A header already in the buffer (the usual case: it came with the idle read) is parsed
  // at once; Beast's read, which would post its completion, only when bytes are missing.
  error_code hec;
  std::size_t hn = 0;
  if (!io_now::parse_buffered(parser, buffer_, io_now::HeaderDone{}, hec, hn)) {
    auto [rec, rn] = co_await http::async_read_header(stream_, buffer_, parser, use_tuple);
    hec = rec;
    hn += rn;
  }
  disarm();
  if (timed_out()) {
    co_await refuse(http::status::request_timeout, "request_timeout", "Request Timeout",
                    "the request header was not received in time", 11, ctx, limits.body_timeout);
    co_return false;
  }
  // Beast applies header_limit to the start line and to the field section separately when
  // both are already buffered, so a header of up to twice the limit passed or not depending
  // on how its bytes arrived; hn counts the whole header (found by fuzz/request).
  if (hec == http::error::header_limit || (!hec && hn > limits.max_header_bytes)) {
    co_await refuse(http::status::request_header_fields_too_large, "headers_too_large",
                    "Request Header Fields Too Large",
                    "the request header exceeds " + std::to_string(limits.max_header_bytes) +
                        " bytes",
                    11, ctx, limits.body_timeout);
    co_return false;
  }
  if (hec) {
    if (is_malformed(hec)) {
      co_await refuse(http::status::bad_request, "bad_request", "Bad Request",
                      "malformed request header", 11, ctx, limits.body_timeout);
    }
    co_return false;  // refused, or the client went away mid-header
  }
  ctx.received_at = SteadyClock::now();
  const unsigned version = parser.get().version();

  const FramingCheck framing = inspect_framing(parser.get());
  if (framing.framing == BodyFraming::invalid) {
    co_await refuse(http::status::bad_request, "bad_request", "Bad Request", framing.problem,
                    version, ctx, limits.body_timeout);
    co_return false;
  }
  // Host rules, the one target normalization and the combined Connection field: from here
  // on every reader of the header sees the same request (server/request_head.hpp).
  if (const HeadCheck head = prepare_request_head(parser.get(), owner_->options().normalize_target);
      !head.ok) {
    co_await refuse(http::status::bad_request, "bad_request", "Bad Request", head.problem,
                    version, ctx, limits.body_timeout);
    co_return false;
  }
  if (framing.framing == BodyFraming::length && framing.length > limits.max_request_body) {
    co_await refuse(http::status::payload_too_large, "request_too_large", "Content Too Large",
                    "the request body exceeds " + std::to_string(limits.max_request_body) +
                        " bytes",
                    version, ctx, limits.body_timeout);
    co_return false;
  }
  co_return true;
}

// 4. The body, under the body timeout and size limit.
template <class Stream>
asio::awaitable<bool> Session<Stream>::read_body(http_parse::MessageParser<true>& parser,
                                         const settings::Limits& limits,
                                         const RequestContext& ctx) {
  if (parser.is_done()) co_return true;
  const unsigned version = parser.get().version();
  if (version >= 11 && expects_continue(parser.get())) {
    // The client is waiting for our go-ahead before uploading (curl does this above
    // 1 KiB); without it the exchange stalls for the client's own expect timeout.
    http::response<http::empty_body> go_ahead{http::status::continue_, 11};
    arm(limits.body_timeout, Deadline::write);
    auto [cec, cn] = co_await http::async_write(stream_, go_ahead, use_tuple);
    disarm();
    if (cec || timed_out()) co_return false;
  }
  parser.body_limit(limits.max_request_body);  // enforces the limit on chunked bodies
  // Beast's parser waits for a whole chunk line, and for the whole trailer section, before
  // it looks at them; an extension or a trailer field that never ends would otherwise grow
  // the buffer until the body timeout. Capped, the read fails with buffer_overflow
  // instead. Body bytes are consumed as they arrive, so only such unfinished metadata ever
  // fills it; bytes already buffered (pipelined) may exceed the cap, they are parsed
  // before anything more is read.
  buffer_.max_size(std::max(buffer_.size(), limits.max_header_bytes + kChunkLineSlack));
  arm(limits.body_timeout, Deadline::read);
  // As for the header: a body already buffered is parsed at once (eager, as Beast's
  // http::async_read sets it).
  parser.eager(true);
  error_code bec;
  std::size_t parsed = 0;
  if (!io_now::parse_buffered(parser, buffer_, io_now::MessageDone{}, bec, parsed)) {
    auto [rec, rn] = co_await http::async_read(stream_, buffer_, parser, use_tuple);
    bec = rec;
  }
  disarm();
  buffer_.max_size(kUnbounded);
  if (!timed_out() && !bec) co_return true;
  auto overflow = parser.overflow();
  if (bec == http::error::buffer_overflow) {
    const auto pending = buffer_.cdata();
    overflow = http_parse::pending_overflow(
        std::string_view(static_cast<const char*>(pending.data()), pending.size()));
  }
  co_await refuse_body(bec, overflow, limits, version, ctx);
  co_return false;
}

// 5. The handler, then the response; true when the connection carries another request.
template <class Stream>
asio::awaitable<bool> Session<Stream>::respond(Request& req, const RequestContext& ctx,
                                       const settings::Limits& limits) {
  const unsigned version = req.version();
  Response res = co_await call_handler(req, ctx);
  const bool keep_alive = req.keep_alive() && !asks_to_close(res) && !owner_->draining() &&
                          !close_requested_;
  frame_response(res, req.method());
  res.version(version);
  res.keep_alive(keep_alive);
  if (!co_await write(res, limits.body_timeout)) co_return false;
  if (!keep_alive) {
    co_await lingering_close();
    co_return false;
  }
  co_return true;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Public interface

struct Server::Impl : detail::Listener {
  using Listener::Listener;
};

Server::Server(asio::io_context& ioc, ListenerOptions options, LimitsSource limits,
               Handler handler, std::shared_ptr<ConnectionGauge> gauge, RejectHook on_reject)
    : impl_(std::make_shared<Impl>(ioc, std::move(options), std::move(limits), std::move(handler),
                                   std::move(gauge), std::move(on_reject))) {}

// Sessions keep the listener state alive on their own; the Server object only has to stop
// new ones from arriving (posted, so this is safe from any thread).
Server::~Server() {
  if (impl_) impl_->stop_accepting();
}

void Server::start() { impl_->start(); }
std::uint16_t Server::port() const { return impl_->port(); }
void Server::stop_accepting() { impl_->stop_accepting(); }
void Server::close_idle() { impl_->close_idle(); }
std::size_t Server::active_connections() const noexcept { return impl_->active(); }

}  // namespace idem::server
