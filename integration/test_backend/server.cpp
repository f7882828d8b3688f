#include "server.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "common/text.hpp"

namespace idem::test_backend {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace json = boost::json;
using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// Generous limits: the backend must never be the component that rejects a request, since
// the tests are about what the sidecar lets through (its own limits are far lower).
constexpr std::size_t kHeaderLimit = 1 << 20;
constexpr std::uint64_t kBodyLimit = 64ull << 20;
constexpr std::size_t kMaxGeneratedBody = 256u << 20;
// A client that stops reading must not pin a held exchange forever.
constexpr auto kWriteTimeout = 30s;

constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);

std::optional<std::string_view> header(const Request& req, std::string_view name) {
  auto it = req.find(name);  // Beast compares field names case-insensitively
  if (it == req.end()) {
    return std::nullopt;
  }
  return it->value();
}

template <class T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

Response text_response(const Request& req, http::status status, std::string body,
                       std::string_view content_type = "text/plain") {
  Response res{status, req.version()};
  res.set(http::field::server, "idem_test_backend");
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  return res;
}

using text::from_hex;

// X-Test-Header-Hex: each value is the hex of "Name: value" (any bytes, so a test can send
// what a client could not put in a request header); those names replace the backend's own.
void apply_header_overrides(const Request& req, Response& res) {
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& field : req) {
    if (!beast::iequals(field.name_string(), "X-Test-Header-Hex")) {
      continue;
    }
    const auto line = from_hex(field.value());
    if (!line) {
      continue;
    }
    const auto colon = line->find(':');
    if (colon == std::string::npos) {
      continue;
    }
    std::string value = line->substr(colon + 1);
    if (!value.empty() && value.front() == ' ') {
      value.erase(0, 1);
    }
    overrides.emplace_back(line->substr(0, colon), std::move(value));
  }
  for (const auto& [name, value] : overrides) {
    res.erase(name);
  }
  for (const auto& [name, value] : overrides) {
    res.insert(name, value);
  }
}

Response business_response(const Request& req, const CallRecord& call) {
  unsigned status = req.method() == http::verb::post ? 201 : 200;
  if (auto wanted = header(req, "X-Test-Status")) {
    auto parsed = parse_number<unsigned>(*wanted);
    if (!parsed || *parsed < 200 || *parsed > 599) {
      return text_response(req, http::status::bad_request, "invalid X-Test-Status\n");
    }
    status = *parsed;
  }

  Response res{static_cast<http::status>(status), req.version()};
  res.set(http::field::server, "idem_test_backend");
  const std::string seq = std::to_string(call.seq);
  res.set(http::field::location, "/orders/ord-" + seq);
  res.set(http::field::etag, "\"e" + seq + "\"");
  // Neither of these is in the default replay list: a replay that carries them shows that
  // the sidecar replayed more than it was told to.
  res.set("X-Backend-Seq", seq);
  res.set(http::field::set_cookie, "s=" + seq);

  const bool bodyless = status == 204 || status == 304 || req.method() == http::verb::head;
  if (!bodyless) {
    if (auto size_text = header(req, "X-Test-Body-Size")) {
      auto size = parse_number<std::size_t>(*size_text);
      if (!size || *size > kMaxGeneratedBody) {
        return text_response(req, http::status::bad_request, "invalid X-Test-Body-Size\n");
      }
      res.set(http::field::content_type, "text/plain");
      res.body().assign(*size, 'x');
    } else {
      json::object order;
      order["order_id"] = "ord-" + seq;
      order["seq"] = call.seq;
      order["attempt"] = header(req, "X-Idempotency-Attempt").value_or("");
      order["operation_id"] = header(req, "X-Idempotency-Operation-Id").value_or("");
      order["tenant"] = header(req, "X-Tenant-Id").value_or("");
      res.set(http::field::content_type, "application/json");
      res.body() = json::serialize(order);
    }
  }
  apply_header_overrides(req, res);
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  if (status == 204 || status == 304) {
    // RFC 9110 §8.6: no Content-Length on 204; on 304 it would have to describe the
    // representation we do not have. Beast adds "0" for both, so take it out again.
    res.erase(http::field::content_length);
  }
  return res;
}

// The client may have closed while we held its request. Reading is not an option (the
// bytes belong to a pipelined next request), so peek: an orderly close reads as 0 bytes.
// Writing instead would "succeed" into the kernel buffer and hide the close.
bool peer_gone(tcp::socket& socket) {
  char byte;
  const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    return true;
  }
  if (n < 0) {
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
  return false;
}

HeaderList header_list(const Request& req) {
  HeaderList headers;
  for (const auto& field : req) {
    headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  return headers;
}

}  // namespace

Server::Server(tcp::acceptor acceptor) : acceptor_(std::move(acceptor)) {}

asio::awaitable<void> Server::run() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(tuple_awaitable);
    if (ec == asio::error::operation_aborted) {
      co_return;
    }
    if (ec) {
      // EMFILE and friends: back off instead of spinning, keep serving the others.
      std::cerr << "idem_test_backend: accept: " << ec.message() << std::endl;
      asio::steady_timer pause(acceptor_.get_executor(), 50ms);
      co_await pause.async_wait(tuple_awaitable);
      continue;
    }
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    asio::co_spawn(acceptor_.get_executor(), session(std::move(socket)),
                   [](std::exception_ptr e) {
                     if (!e) {
                       return;
                     }
                     // One broken session must not take the backend (and every test using
                     // it) down with it.
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::exception& ex) {
                       std::cerr << "idem_test_backend: session: " << ex.what() << std::endl;
                     }
                   });
  }
}

asio::awaitable<void> Server::run_tls(tcp::acceptor acceptor, std::shared_ptr<asio::ssl::context> ctx) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(tuple_awaitable);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      asio::steady_timer pause(acceptor.get_executor(), 50ms);
      co_await pause.async_wait(tuple_awaitable);
      continue;
    }
    asio::co_spawn(acceptor.get_executor(), tls_session(std::move(socket), ctx), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::cerr << "idem_test_backend: TLS session: " << ex.what() << std::endl;
      }
    });
  }
}

asio::awaitable<void> Server::tls_session(tcp::socket socket, std::shared_ptr<asio::ssl::context> ctx) {
  beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), *ctx);
  beast::get_lowest_layer(stream).expires_after(kWriteTimeout);
  auto [ec] = co_await stream.async_handshake(asio::ssl::stream_base::server, tuple_awaitable);
  if (ec) co_return;  // the client refused our certificate (or was not TLS)
  co_await serve(stream);
}

asio::awaitable<void> Server::session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  co_await serve(stream);
}

// One connection's requests, plain or TLS (Stream: tcp_stream or ssl_stream over one).
template <class Stream>
asio::awaitable<void> Server::serve(Stream& stream) {
  auto& tcp_layer = beast::get_lowest_layer(stream);
  beast::flat_buffer buffer;
  // X-Test-Stray-Hex: bytes owed from the previous answer on this connection, written just
  // before the next answer (a body the backend sent late, after a bodiless status).
  std::string stray;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(kHeaderLimit);
    parser.body_limit(kBodyLimit);
    // Idle keep-alive connections wait as long as the client likes: the sidecar's pool
    // decides when to drop them, which is part of what the tests observe.
    tcp_layer.expires_never();
    auto [header_ec, header_n] =
        co_await http::async_read_header(stream, buffer, parser, tuple_awaitable);
    (void)header_n;
    if (header_ec) {
      break;  // closed, reset or unparseable: nothing to answer
    }
    // Behave like a real server towards a client that waits for permission to send the
    // body; otherwise such a client stalls for its own timeout first.
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> go_ahead{http::status::continue_, parser.get().version()};
      auto [ec, n] = co_await http::async_write(stream, go_ahead, tuple_awaitable);
      (void)n;
      if (ec) {
        break;
      }
    }
    if (!parser.is_done()) {
      auto [body_ec, body_n] = co_await http::async_read(stream, buffer, parser, tuple_awaitable);
      (void)body_n;
      if (body_ec) {
        break;
      }
    }
    Request req = parser.release();

    const std::string_view target = req.target();
    if (target.starts_with("/__")) {
      Response res = control(req);
      tcp_layer.expires_after(kWriteTimeout);
      auto [ec, n] = co_await http::async_write(stream, res, tuple_awaitable);
      (void)n;
      if (ec || !res.keep_alive()) {
        break;
      }
      continue;
    }

    auto call = recorder_.record(std::string(req.method_string()), std::string(target),
                                 header_list(req), req.body());
    if (auto hold = header(req, "X-Test-Hold"); hold && !hold->empty()) {
      co_await holds_.wait(std::string(*hold));
    }
    if (auto delay_text = header(req, "X-Test-Delay-Ms")) {
      if (auto delay = parse_number<unsigned>(*delay_text); delay && *delay > 0) {
        asio::steady_timer timer(co_await asio::this_coro::executor,
                                 std::chrono::milliseconds(*delay));
        co_await timer.async_wait(tuple_awaitable);
      }
    }

    if (header(req, "X-Test-Close").value_or("") == "before-response") {
      // A reset rather than an orderly close: the client sees the request vanish with no
      // answer, the "outcome unknown" case the sidecar must treat as such.
      boost::system::error_code ignored;
      tcp_layer.socket().set_option(asio::socket_base::linger(true, 0), ignored);
      tcp_layer.socket().close(ignored);
      recorder_.mark_completed(*call);
      co_return;
    }

    Response res = business_response(req, *call);
    call->status = static_cast<int>(res.result_int());
    if (peer_gone(tcp_layer.socket())) {
      call->client_gone = true;
      recorder_.mark_completed(*call);
      break;
    }
    tcp_layer.expires_after(kWriteTimeout);
    if (!stray.empty()) {
      auto [ec, n] = co_await asio::async_write(stream, asio::buffer(stray), tuple_awaitable);
      (void)n;
      stray.clear();
      if (ec) {
        call->client_gone = true;
        recorder_.mark_completed(*call);
        break;
      }
    }
    boost::system::error_code write_ec;
    if (auto raw = header(req, "X-Test-Raw-Response-Hex")) {
      // Exactly these bytes instead of the response above, framing and all.
      const auto bytes = from_hex(*raw).value_or("");
      if (auto owed = header(req, "X-Test-Stray-Hex")) {
        stray = from_hex(*owed).value_or("");
      }
      if (bytes.size() >= 12) {
        if (auto parsed = parse_number<unsigned>(std::string_view(bytes).substr(9, 3))) {
          call->status = static_cast<int>(*parsed);
        }
      }
      auto [ec, n] = co_await asio::async_write(stream, asio::buffer(bytes), tuple_awaitable);
      (void)n;
      write_ec = ec;
    } else {
      auto [ec, n] = co_await http::async_write(stream, res, tuple_awaitable);
      (void)n;
      write_ec = ec;
    }
    if (write_ec) {
      call->client_gone = true;
    } else {
      call->responded = true;
    }
    recorder_.mark_completed(*call);
    if (write_ec || !res.keep_alive()) {
      break;
    }
  }
  boost::system::error_code ignored;
  tcp_layer.socket().shutdown(tcp::socket::shutdown_send, ignored);
  tcp_layer.socket().close(ignored);
}

Server::Response Server::control(const Request& req) {
  std::string_view path = req.target();
  path = path.substr(0, path.find('?'));
  const auto method = req.method();

  if (path == "/__health" && method == http::verb::get) {
    return text_response(req, http::status::ok, "ok\n");
  }
  if (path == "/__calls" && method == http::verb::get) {
    return text_response(req, http::status::ok, json::serialize(recorder_.to_json()),
                         "application/json");
  }
  if (path == "/__reset" && method == http::verb::post) {
    recorder_.reset();
    holds_.reset();
    return text_response(req, http::status::ok, "{\"reset\":true}", "application/json");
  }
  constexpr std::string_view release_prefix = "/__release/";
  if (path.starts_with(release_prefix) && path.size() > release_prefix.size() &&
      method == http::verb::post) {
    std::string name(path.substr(release_prefix.size()));
    const auto woken = holds_.release(name);
    json::object body;
    body["released"] = name;
    body["woken"] = woken;
    return text_response(req, http::status::ok, json::serialize(body), "application/json");
  }
  return text_response(req, http::status::not_found, "unknown control endpoint\n");
}

}  // namespace idem::test_backend
