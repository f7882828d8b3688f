// idem_fault_proxy — loopback TCP links whose behaviour a test switches at run time, for
// the fault-injection run (scripts/chaos): one link sits between each sidecar replica and
// PostgreSQL, one between each replica and the order API.
//
//   idem_fault_proxy --control 127.0.0.1:0 --link NAME=LISTEN_PORT:HOST:PORT [--link ...]
//
// Listens on 127.0.0.1 only. Prints "CONTROL <port>", one "LINK <name> <port>" per link,
// then "READY". Port 0 picks a free one. The control port speaks HTTP/1.1:
//   GET /links              every link: mode and counters (JSON)
//   PUT /links/NAME  MODE   one link;   MODE is {"mode": "...", "delay_ms": N} (link_mode.hpp)
//   PUT /links       MODE   every link
// SIGINT and SIGTERM stop it. One thread, one io_context: the links share no locks.
// The data path has no timeouts on purpose: a blackholed link must hold its connections
// for as long as the test wants; the endpoints (sidecar, libpq, the API) have their own.
#include <csignal>
#include <cstdint>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "common/types.hpp"
#include "link_mode.hpp"

namespace {

using namespace idem;
using namespace idem::chaos;
using tcp = asio::ip::tcp;
namespace json = boost::json;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
constexpr Millis kConnectTimeout{2000};
constexpr std::size_t kChunk = 16 * 1024;

// Closes with RST instead of FIN: the peer's next read or write fails, as after a crash
// of a middlebox or a real reset on the network.
void reset_socket(tcp::socket& s) {
  error_code ignored;
  if (!s.is_open()) return;
  s.set_option(asio::socket_base::linger(true, 0), ignored);
  s.close(ignored);
}

class Link;

// One client connection and the connection to the target that serves it.
struct Session {
  Session(tcp::socket client, asio::any_io_executor ex) : down(std::move(client)), up(ex) {}
  tcp::socket down;  // from the client (a sidecar replica)
  tcp::socket up;    // to the target
  int open_directions = 2;
  bool aborted = false;

  void abort() {
    aborted = true;
    reset_socket(down);
    reset_socket(up);
  }
};

class Link {
 public:
  Link(asio::io_context& io, std::string name, std::uint16_t port, tcp::endpoint target)
      : io_(io), name_(std::move(name)), port_(port), target_(target), changed_(io) {
    changed_.expires_at(asio::steady_timer::time_point::max());
  }

  const std::string& name() const { return name_; }
  std::uint16_t port() const { return port_; }

  // Binds (the first time on the requested port, later on the port it got) and accepts.
  bool open() {
    auto acceptor = std::make_unique<tcp::acceptor>(io_);
    error_code ec;
    const tcp::endpoint at(asio::ip::make_address_v4("127.0.0.1"), port_);
    acceptor->open(at.protocol(), ec);
    if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor->bind(at, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      std::cerr << "link " << name_ << ": cannot listen on port " << port_ << ": "
                << ec.message() << std::endl;
      return false;
    }
    port_ = acceptor->local_endpoint().port();
    acceptor_ = std::move(acceptor);
    asio::co_spawn(io_, accept_loop(acceptor_.get()), asio::detached);
    return true;
  }

  void set_mode(LinkMode mode) {
    const LinkMode before = mode_;
    mode_ = mode;
    if (mode.kind == LinkKind::reset) {
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) {
          s->abort();
          ++resets_;
        }
      }
    }
    if (mode.kind == LinkKind::refuse && acceptor_) {
      error_code ignored;
      acceptor_->close(ignored);  // its accept loop ends with operation_aborted
      retired_.push_back(std::move(acceptor_));
    } else if (mode.kind != LinkKind::refuse && !acceptor_) {
      reopen();
    }
    prune();
    changed_.cancel();  // wakes every connection waiting out a blackhole
    std::cout << "link " << name_ << ": " << render_link_mode(before) << " -> "
              << render_link_mode(mode) << std::endl;
  }

  json::object status() const {
    std::size_t open = 0;
    for (const auto& weak : sessions_) open += weak.expired() ? 0 : 1;
    return json::object{{"port", port_},
                        {"mode", link_kind_name(mode_.kind)},
                        {"delay_ms", mode_.delay.count()},
                        {"connections", accepted_},
                        {"open", open},
                        {"resets", resets_},
                        {"bytes_up", bytes_up_},
                        {"bytes_down", bytes_down_}};
  }

 private:
  // Leaving "refuse": listen again on the same port. Another process may have taken it in
  // between (unlikely on loopback); then keep trying, since a refused link must heal.
  void reopen() {
    if (open()) return;
    auto timer = std::make_shared<asio::steady_timer>(io_, Millis(50));
    timer->async_wait([this, timer](const error_code&) {
      if (!acceptor_ && mode_.kind != LinkKind::refuse) reopen();
    });
  }

  void prune() {
    sessions_.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
  }

  // Returns once the link is not blackholed.
  asio::awaitable<void> through_blackhole() {
    while (mode_.kind == LinkKind::blackhole) {
      co_await changed_.async_wait(use_tuple);
    }
  }

  asio::awaitable<void> accept_loop(tcp::acceptor* acceptor) {
    for (;;) {
      auto [ec, socket] = co_await acceptor->async_accept(use_tuple);
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      if (ec) continue;  // a connection that died before we took it
      ++accepted_;
      if (mode_.kind == LinkKind::reset) {
        reset_socket(socket);
        ++resets_;
        continue;
      }
      auto session = std::make_shared<Session>(std::move(socket), io_.get_executor());
      prune();
      sessions_.push_back(session);
      asio::co_spawn(io_, serve(session), asio::detached);
    }
  }

  asio::awaitable<void> serve(std::shared_ptr<Session> s) {
    co_await through_blackhole();
    if (s->aborted) co_return;
    // The connect is bounded: a target that does not answer SYNs must not hold the client
    // forever (it sees a reset, as from a middlebox giving up).
    asio::steady_timer timeout(io_, kConnectTimeout);
    timeout.async_wait([s](const error_code& ec) {
      if (!ec) s->abort();
    });
    auto [ec] = co_await s->up.async_connect(target_, use_tuple);
    timeout.cancel();
    if (ec || s->aborted) {
      s->abort();
      co_return;
    }
    error_code ignored;
    s->up.set_option(tcp::no_delay(true), ignored);
    s->down.set_option(tcp::no_delay(true), ignored);
    asio::co_spawn(io_, pump(s, true), asio::detached);
    asio::co_spawn(io_, pump(s, false), asio::detached);
  }

  // Copies one direction. EOF is passed on as a half-close; an error resets both sides,
  // so a reset anywhere reaches both ends as one.
  asio::awaitable<void> pump(std::shared_ptr<Session> s, bool upstream) {
    tcp::socket& from = upstream ? s->down : s->up;
    tcp::socket& to = upstream ? s->up : s->down;
    std::vector<char> buffer(kChunk);
    for (;;) {
      co_await through_blackhole();
      if (s->aborted) co_return;
      auto [rec, n] = co_await from.async_read_some(asio::buffer(buffer), use_tuple);
      if (s->aborted) co_return;
      if (rec == asio::error::eof) {
        error_code ignored;
        to.shutdown(tcp::socket::shutdown_send, ignored);
        if (--s->open_directions == 0) {
          from.close(ignored);
          to.close(ignored);
        }
        co_return;
      }
      if (rec) {
        s->abort();
        co_return;
      }
      if (mode_.kind == LinkKind::delay) {
        asio::steady_timer wait(io_, mode_.delay);
        co_await wait.async_wait(use_tuple);
      }
      co_await through_blackhole();  // bytes read before a partition wait for its end
      if (s->aborted) co_return;
      auto [wec, written] = co_await asio::async_write(to, asio::buffer(buffer.data(), n), use_tuple);
      if (wec || s->aborted) {
        s->abort();
        co_return;
      }
      (upstream ? bytes_up_ : bytes_down_) += written;
    }
  }

  asio::io_context& io_;
  std::string name_;
  std::uint16_t port_;
  tcp::endpoint target_;
  LinkMode mode_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  // Closed acceptors stay alive until exit: their accept loops still hold them.
  std::vector<std::unique_ptr<tcp::acceptor>> retired_;
  std::list<std::weak_ptr<Session>> sessions_;
  asio::steady_timer changed_;  // never expires; cancelled on every mode change
  std::uint64_t accepted_ = 0, resets_ = 0, bytes_up_ = 0, bytes_down_ = 0;
};

using Links = std::map<std::string, std::unique_ptr<Link>, std::less<>>;

http::response<http::string_body> answer(http::status status, std::string body) {
  http::response<http::string_body> res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

json::object all_status(const Links& links) {
  json::object out;
  for (const auto& [name, link] : links) out[name] = link->status();
  return out;
}

http::response<http::string_body> control(Links& links,
                                          const http::request<http::string_body>& req) {
  const std::string_view target = req.target();
  constexpr std::string_view prefix = "/links";
  if (!target.starts_with(prefix)) return answer(http::status::not_found, R"({"error":"no such path"})");
  std::string_view name = target.substr(prefix.size());
  if (!name.empty() && name.front() != '/') {
    return answer(http::status::not_found, R"({"error":"no such path"})");
  }
  if (!name.empty()) name.remove_prefix(1);

  if (req.method() == http::verb::get && name.empty()) {
    return answer(http::status::ok, json::serialize(all_status(links)));
  }
  if (req.method() != http::verb::put) {
    return answer(http::status::method_not_allowed, R"({"error":"GET /links or PUT"})");
  }
  auto mode = parse_link_mode(req.body());
  if (auto* error = std::get_if<std::string>(&mode)) {
    return answer(http::status::bad_request, json::serialize(json::object{{"error", *error}}));
  }
  if (name.empty()) {
    for (auto& [n, link] : links) link->set_mode(std::get<LinkMode>(mode));
  } else {
    const auto it = links.find(name);
    if (it == links.end()) return answer(http::status::not_found, R"({"error":"no such link"})");
    it->second->set_mode(std::get<LinkMode>(mode));
  }
  return answer(http::status::ok, json::serialize(all_status(links)));
}

asio::awaitable<void> control_session(Links& links, tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> req;
    stream.expires_after(std::chrono::seconds(30));
    auto [rec, read] = co_await http::async_read(stream, buffer, req, use_tuple);
    if (rec) co_return;
    auto res = control(links, req);
    res.keep_alive(req.keep_alive());
    stream.expires_after(std::chrono::seconds(10));
    auto [wec, written] = co_await http::async_write(stream, res, use_tuple);
    if (wec || !req.keep_alive()) co_return;
  }
}

asio::awaitable<void> control_loop(Links& links, tcp::acceptor& acceptor) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    asio::co_spawn(acceptor.get_executor(), control_session(links, std::move(socket)),
                   asio::detached);
  }
}

struct LinkSpec {
  std::string name;
  std::uint16_t port = 0;
  tcp::endpoint target;
};

std::optional<std::uint16_t> port_number(std::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  unsigned value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

// NAME=LISTEN_PORT:HOST:PORT
std::optional<LinkSpec> parse_link(std::string_view text) {
  const auto eq = text.find('=');
  if (eq == 0 || eq == std::string_view::npos) return std::nullopt;
  LinkSpec spec{.name = std::string(text.substr(0, eq))};
  std::string_view rest = text.substr(eq + 1);
  const auto first = rest.find(':');
  const auto last = rest.rfind(':');
  if (first == std::string_view::npos || first == last) return std::nullopt;
  const auto listen = port_number(rest.substr(0, first));
  const auto port = port_number(rest.substr(last + 1));
  error_code ec;
  const auto host = asio::ip::make_address(std::string(rest.substr(first + 1, last - first - 1)), ec);
  if (!listen || !port || ec) return std::nullopt;
  spec.port = *listen;
  spec.target = tcp::endpoint(host, *port);
  return spec;
}

constexpr const char* kUsage =
    "usage: idem_fault_proxy --control HOST:PORT --link NAME=LISTEN_PORT:HOST:PORT [--link ...]\n"
    "  loopback TCP links switched at run time: PUT /links/NAME {\"mode\": \"pass\" | \"delay\" |\n"
    "  \"blackhole\" | \"reset\" | \"refuse\", \"delay_ms\": N}; GET /links shows them\n";

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::uint16_t> control_port;
  std::vector<LinkSpec> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (i + 1 >= argc) {
      std::cerr << "idem_fault_proxy: " << arg << " needs a value\n" << kUsage;
      return 2;
    }
    const std::string_view value = argv[++i];
    if (arg == "--control") {
      const auto colon = value.rfind(':');
      control_port = colon == std::string_view::npos ? std::nullopt
                                                     : port_number(value.substr(colon + 1));
    } else if (arg == "--link") {
      auto spec = parse_link(value);
      if (!spec) {
        std::cerr << "idem_fault_proxy: bad --link '" << value << "'\n" << kUsage;
        return 2;
      }
      specs.push_back(std::move(*spec));
    } else {
      std::cerr << "idem_fault_proxy: unknown option '" << arg << "'\n" << kUsage;
      return 2;
    }
  }
  if (!control_port || specs.empty()) {
    std::cerr << "idem_fault_proxy: --control and at least one --link are required\n" << kUsage;
    return 2;
  }

  asio::io_context io(1);
  Links links;
  tcp::acceptor control_acceptor(io);
  try {
    const tcp::endpoint at(asio::ip::make_address_v4("127.0.0.1"), *control_port);
    control_acceptor.open(at.protocol());
    control_acceptor.set_option(asio::socket_base::reuse_address(true));
    control_acceptor.bind(at);
    control_acceptor.listen();
  } catch (const std::exception& e) {
    std::cerr << "idem_fault_proxy: control port: " << e.what() << "\n";
    return 1;
  }
  std::cout << "CONTROL " << control_acceptor.local_endpoint().port() << std::endl;
  for (auto& spec : specs) {
    auto link = std::make_unique<Link>(io, spec.name, spec.port, spec.target);
    if (!link->open()) return 1;
    std::cout << "LINK " << link->name() << " " << link->port() << std::endl;
    links.emplace(spec.name, std::move(link));
  }
  asio::co_spawn(io, control_loop(links, control_acceptor), asio::detached);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const error_code&, int) { io.stop(); });
  std::cout << "READY" << std::endl;
  io.run();
  return 0;
}
