// The LISTEN/NOTIFY listener against a real PostgreSQL (DATABASE_URL): delivery, loss and
// reconnection, the liveness ping, stop(), option validation, and that connecting never
// blocks the event loop. Every wait is on an observable condition with a bounded deadline.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "pg/listener.hpp"
#include "pg/pg_test_support.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

// Channels and application names unique to this process and test, so that suites
// running at once against one server never see each other's sessions or notifications.
std::string unique(const std::string& prefix) {
  static int counter = 0;
  return prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(++counter);
}

struct Recorder {
  std::vector<std::string> payloads;
  std::vector<bool> states;
  int count(bool state) const {
    int n = 0;
    for (bool s : states) n += s == state ? 1 : 0;
    return n;
  }
};

pg::ListenerOptions options() {
  pg::ListenerOptions o;
  o.conninfo = test::database_url();
  o.channel = unique("idem_listener_test");
  o.connect_timeout = 3000ms;
  o.statement_timeout = 2000ms;
  o.ping_interval = 1000ms;
  o.reconnect_backoff = 100ms;
  o.application_name = unique("idem-listener-test");
  return o;
}

std::shared_ptr<pg::Listener> start(asio::io_context& ctx, Recorder& rec,
                                    const pg::ListenerOptions& o) {
  return pg::Listener::start(
      ctx.get_executor(), o, [&rec](std::string_view p) { rec.payloads.emplace_back(p); },
      [&rec](bool listening) { rec.states.push_back(listening); });
}

// Runs the io_context until `done()` holds, for at most `limit`.
template <class Pred>
bool run_until(asio::io_context& ctx, Pred done, Millis limit = 10000ms) {
  const auto until = SteadyClock::now() + limit;
  while (!done()) {
    if (SteadyClock::now() >= until) return false;
    if (ctx.stopped()) ctx.restart();
    ctx.run_one_for(10ms);
  }
  return true;
}

// Runs the io_context for a fixed time: for tests whose claim is "nothing happens".
void run_for(asio::io_context& ctx, Millis d) {
  ctx.restart();
  ctx.run_for(d);
}

void notify(test::Db& sql, const std::string& channel, const std::string& payload) {
  sql.exec("SELECT pg_notify($1, $2)", {channel, payload});
}

std::optional<std::string> backend_pid(test::Db& sql, const std::string& application_name) {
  return sql.scalar("SELECT pid::text FROM pg_stat_activity WHERE application_name = $1",
                    {application_name});
}

// Polls the server (not the listener) until the session with that application_name is
// gone: closing is the listener's side, the backend's exit is the server's.
bool session_gone(test::Db& sql, const std::string& application_name, Millis limit = 5000ms) {
  const auto until = SteadyClock::now() + limit;
  while (SteadyClock::now() < until) {
    if (sql.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                   {application_name}) == "0") {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// A TCP server that accepts and then never answers: libpq's startup waits forever, so
// only the connect deadline ends an attempt. Counts the attempts.
struct SilentServer {
  explicit SilentServer(asio::io_context& ctx)
      : acceptor(ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    acceptor.listen();
    accept();
  }
  void accept() {
    acceptor.async_accept([this](const error_code& ec, asio::ip::tcp::socket s) {
      if (ec) return;
      held.push_back(std::move(s));
      if (on_accept) on_accept();
      accept();
    });
  }
  std::string conninfo() const {
    return "host=127.0.0.1 port=" + std::to_string(acceptor.local_endpoint().port()) +
           " user=postgres password=sekrit-pw dbname=postgres sslmode=disable";
  }
  asio::ip::tcp::acceptor acceptor;
  std::vector<asio::ip::tcp::socket> held;
  std::function<void()> on_accept;  // runs on the server's thread
};

// Routes spdlog's default logger into a string for the test's duration.
struct CapturedLog {
  CapturedLog() : previous(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
  int count(const std::string& needle) const {
    const std::string s = out.str();
    int n = 0;
    for (auto at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> previous;
};

}  // namespace

TEST_CASE("notifications on the channel are delivered once listening; other channels are not") {
  asio::io_context ctx;
  Recorder rec;
  const auto o = options();
  auto listener = start(ctx, rec, o);
  REQUIRE(run_until(ctx, [&] { return !rec.states.empty(); }));
  CHECK(rec.states == std::vector<bool>{true});
  CHECK(listener->listening());

  test::Db other(test::database_url());
  notify(other, o.channel, "abc");
  REQUIRE(run_until(ctx, [&] { return rec.payloads.size() >= 1; }));
  CHECK(rec.payloads == std::vector<std::string>{"abc"});

  // One transaction: delivered at its commit, all of them, in order.
  other.exec("BEGIN");
  notify(other, o.channel, "one");
  notify(other, o.channel, "two");
  notify(other, o.channel + "_other", "not for us");
  notify(other, o.channel, "three");
  other.exec("COMMIT");
  REQUIRE(run_until(ctx, [&] { return rec.payloads.size() >= 4; }));
  // A later marker: once it is here, anything the earlier transaction sent would be too.
  notify(other, o.channel, "end");
  REQUIRE(run_until(ctx, [&] { return rec.payloads.size() >= 5; }));
  run_for(ctx, 50ms);
  CHECK(rec.payloads == std::vector<std::string>{"abc", "one", "two", "three", "end"});
  CHECK(rec.states == std::vector<bool>{true});
  listener->stop();
}

TEST_CASE("a channel named like a reserved word still works") {
  asio::io_context ctx;
  Recorder rec;
  auto o = options();
  o.channel = "select";
  auto listener = start(ctx, rec, o);
  REQUIRE(run_until(ctx, [&] { return listener->listening(); }));
  const std::string payload = unique("reserved");
  test::Db other(test::database_url());
  notify(other, "select", payload);
  REQUIRE(run_until(ctx, [&] {
    return std::find(rec.payloads.begin(), rec.payloads.end(), payload) != rec.payloads.end();
  }));
  listener->stop();
}

TEST_CASE("a terminated session is noticed at once, replaced, and listens again") {
  asio::io_context ctx;
  Recorder rec;
  auto o = options();
  // Far beyond the waits below: the loss must be seen from the socket's EOF, not a ping.
  o.ping_interval = 60000ms;
  auto listener = start(ctx, rec, o);
  REQUIRE(run_until(ctx, [&] { return listener->listening(); }));

  test::Db other(test::database_url());
  const auto pid = backend_pid(other, o.application_name);
  REQUIRE(pid);
  other.exec("SELECT pg_terminate_backend($1::int)", {*pid});
  REQUIRE(run_until(ctx, [&] { return rec.states.size() >= 2; }, 5000ms));
  CHECK(rec.states == std::vector<bool>{true, false});
  REQUIRE(run_until(ctx, [&] { return rec.states.size() >= 3; }, 5000ms));
  CHECK(rec.states == std::vector<bool>{true, false, true});
  CHECK(listener->listening());
  // The old backend may still be on its way out: look for another one.
  CHECK(other.scalar("SELECT count(*) FROM pg_stat_activity "
                     "WHERE application_name = $1 AND pid <> $2::int",
                     {o.application_name, *pid}) == "1");

  notify(other, o.channel, "after reconnect");
  REQUIRE(run_until(ctx, [&] { return !rec.payloads.empty(); }));
  CHECK(rec.payloads == std::vector<std::string>{"after reconnect"});
  CHECK(rec.states.size() == 3);
  listener->stop();
}

TEST_CASE("the ping keeps an idle session alive without flapping") {
  asio::io_context ctx;
  Recorder rec;
  auto o = options();
  o.ping_interval = 50ms;
  auto listener = start(ctx, rec, o);
  REQUIRE(run_until(ctx, [&] { return listener->listening(); }));

  test::Db other(test::database_url());
  const auto pid = backend_pid(other, o.application_name);
  REQUIRE(pid);
  // Each ping moves the session's state_change: sampled between slices of running, the
  // distinct values count the pings (at least one per 60 ms slice when idle).
  std::vector<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    run_for(ctx, 60ms);
    auto changed = other.scalar(
        "SELECT state_change::text || ' ' || query FROM pg_stat_activity WHERE pid = $1::int",
        {*pid});
    REQUIRE(changed);
    if (std::find(seen.begin(), seen.end(), *changed) == seen.end()) seen.push_back(*changed);
  }
  CHECK(seen.size() >= 10);
  CHECK(seen.back().find("SELECT 1") != std::string::npos);
  CHECK(rec.states == std::vector<bool>{true});
  CHECK(backend_pid(other, o.application_name) == pid);

  notify(other, o.channel, "still here");
  REQUIRE(run_until(ctx, [&] { return !rec.payloads.empty(); }));
  CHECK(rec.payloads == std::vector<std::string>{"still here"});
  CHECK(rec.states == std::vector<bool>{true});
  listener->stop();
}

TEST_CASE("a session that stops answering fails its ping and is replaced") {
  if (test::pgctl().empty()) {
    // Freezing a backend of a server that is not a throwaway one would be rude.
    WARN_MESSAGE(false, "IDEM_TEST_PGCTL is not set: frozen-backend test not run");
    return;
  }
  asio::io_context ctx;
  Recorder rec;
  auto o = options();
  o.ping_interval = 100ms;
  o.statement_timeout = 300ms;
  auto listener = start(ctx, rec, o);
  REQUIRE(run_until(ctx, [&] { return listener->listening(); }));
  test::Db other(test::database_url());
  const auto pid_text = backend_pid(other, o.application_name);
  REQUIRE(pid_text);
  const pid_t pid = std::stoi(*pid_text);
  if (::kill(pid, 0) != 0) {
    WARN_MESSAGE(false, "cannot signal the server's backends: frozen-backend test not run");
    listener->stop();
    return;
  }
  // A frozen backend keeps its socket open and silent: only the ping's deadline tells.
  struct Thaw {
    pid_t pid;
    ~Thaw() { ::kill(pid, SIGCONT); }
  } thaw{pid};
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  const auto frozen = SteadyClock::now();
  REQUIRE(run_until(ctx, [&] { return rec.states.size() >= 2; }, 5000ms));
  CHECK(rec.states == std::vector<bool>{true, false});
  // At most one ping interval of silence, then the ping's deadline (plus scheduling slack).
  CHECK(test::elapsed_since(frozen) < 2000ms);
  REQUIRE(run_until(ctx, [&] { return rec.states.size() >= 3; }, 5000ms));
  CHECK(rec.states == std::vector<bool>{true, false, true});
  notify(other, o.channel, "from the new session");
  REQUIRE(run_until(ctx, [&] { return !rec.payloads.empty(); }));
  CHECK(rec.payloads == std::vector<std::string>{"from the new session"});
  listener->stop();
}

TEST_CASE("stop() ends the session and the coroutine") {
  test::Db other(test::database_url());
  auto ctx = std::make_unique<asio::io_context>();
  Recorder rec;
  auto o = options();

  SUBCASE("while listening: on_state(false) once, the session leaves the server") {
    auto listener = start(*ctx, rec, o);
    REQUIRE(run_until(*ctx, [&] { return listener->listening(); }));
    REQUIRE(backend_pid(other, o.application_name));
    listener->stop();
    CHECK(rec.states == std::vector<bool>{true, false});
    CHECK_FALSE(listener->listening());
    listener->stop();  // idempotent
    CHECK(rec.states == std::vector<bool>{true, false});
    CHECK(session_gone(other, o.application_name));

    std::weak_ptr<pg::Listener> weak = listener;
    listener.reset();
    REQUIRE(run_until(*ctx, [&] { return weak.expired(); }, 5000ms));
    notify(other, o.channel, "too late");
    run_for(*ctx, 50ms);
    CHECK(rec.payloads.empty());
    CHECK(rec.states == std::vector<bool>{true, false});
    ctx.reset();
  }

  SUBCASE("from inside a callback: nothing is delivered after it") {
    std::shared_ptr<pg::Listener> listener;
    listener = pg::Listener::start(
        ctx->get_executor(), o,
        [&](std::string_view p) {
          rec.payloads.emplace_back(p);
          listener->stop();
        },
        [&](bool l) { rec.states.push_back(l); });
    REQUIRE(run_until(*ctx, [&] { return listener->listening(); }));
    other.exec("BEGIN");
    notify(other, o.channel, "first");
    notify(other, o.channel, "second");
    other.exec("COMMIT");
    REQUIRE(run_until(*ctx, [&] { return !rec.payloads.empty(); }));
    run_for(*ctx, 50ms);
    CHECK(rec.payloads == std::vector<std::string>{"first"});
    CHECK(rec.states == std::vector<bool>{true, false});
    CHECK(session_gone(other, o.application_name));
    ctx.reset();
  }

  SUBCASE("while connecting: the attempt is abandoned at once") {
    SilentServer server(*ctx);
    o.conninfo = server.conninfo();
    o.connect_timeout = 10000ms;
    auto listener = start(*ctx, rec, o);
    REQUIRE(run_until(*ctx, [&] { return !server.held.empty(); }, 5000ms));
    listener->stop();
    std::weak_ptr<pg::Listener> weak = listener;
    listener.reset();
    const auto stopped = SteadyClock::now();
    REQUIRE(run_until(*ctx, [&] { return weak.expired(); }, 5000ms));
    CHECK(test::elapsed_since(stopped) < 1000ms);
    CHECK(rec.states.empty());
    // The server's sockets go before the io_context (declared first, destroyed last).
  }

  SUBCASE("before the io_context ever ran: no callback at all") {
    auto listener = start(*ctx, rec, o);
    listener->stop();
    std::weak_ptr<pg::Listener> weak = listener;
    listener.reset();
    REQUIRE(run_until(*ctx, [&] { return weak.expired(); }, 5000ms));
    CHECK(rec.states.empty());
    ctx.reset();
  }

  SUBCASE("the caller may keep the listener past the io_context") {
    auto listener = start(*ctx, rec, o);
    REQUIRE(run_until(*ctx, [&] { return listener->listening(); }));
    listener->stop();
    run_for(*ctx, 50ms);
    ctx.reset();
    CHECK_FALSE(listener->listening());
    listener.reset();
  }

  SUBCASE("destroying the io_context without stop() releases everything") {
    std::weak_ptr<pg::Listener> weak;
    {
      auto listener = start(*ctx, rec, o);
      weak = listener;
      REQUIRE(run_until(*ctx, [&] { return listener->listening(); }));
    }
    CHECK_FALSE(weak.expired());  // the running coroutine keeps it alive
    ctx.reset();
    CHECK(weak.expired());
    CHECK(session_gone(other, o.application_name));
  }
}

TEST_CASE("a callback that throws ends the listener visibly") {
  asio::io_context ctx;
  CapturedLog log;
  Recorder rec;
  const auto o = options();
  auto listener = pg::Listener::start(
      ctx.get_executor(), o, [](std::string_view) { throw std::runtime_error("boom"); },
      [&rec](bool l) { rec.states.push_back(l); });
  REQUIRE(run_until(ctx, [&] { return listener->listening(); }));
  test::Db other(test::database_url());
  notify(other, o.channel, "x");
  REQUIRE(run_until(ctx, [&] { return rec.states.size() >= 2; }));
  CHECK(rec.states == std::vector<bool>{true, false});
  CHECK_FALSE(listener->listening());
  CHECK(log.count("stopped by an exception: boom") == 1);
  CHECK(session_gone(other, o.application_name));
  listener->stop();  // a no-op now
  CHECK(rec.states.size() == 2);
}

TEST_CASE("invalid options are refused at start") {
  asio::io_context ctx;
  Recorder rec;
  const std::vector<std::string> channels{"",    "Upper",        "1abc", "a-b", "a b",
                                          "a;b", "\"quoted\"", "é",    std::string(64, 'a')};
  for (const std::string& channel : channels) {
    auto o = options();
    o.channel = channel;
    CHECK_THROWS_AS(start(ctx, rec, o), std::invalid_argument);
  }
  auto o = options();
  o.channel = std::string(63, 'a');
  CHECK_NOTHROW(start(ctx, rec, o)->stop());
  o = options();
  o.ping_interval = 0ms;
  CHECK_THROWS_AS(start(ctx, rec, o), std::invalid_argument);
  o = options();
  o.reconnect_backoff = 0ms;
  CHECK_THROWS_AS(start(ctx, rec, o), std::invalid_argument);
  o = options();
  o.conninfo = "host=127.0.0.1 password";  // does not parse
  CHECK_THROWS_AS(start(ctx, rec, o), std::invalid_argument);
  run_for(ctx, 20ms);
  CHECK(rec.states.empty());
}

// Causal, not timed: the server runs on a thread of its own and, the moment it holds the
// listener's first connection, posts a probe to the listener's event loop. A connect that
// blocked that loop would let the probe run only after the attempt had timed out and been
// logged; a non-blocking one lets it run while the attempt is still pending.
TEST_CASE("an unreachable server: the event loop runs while a connection attempt is pending") {
  asio::io_context ctx;
  asio::io_context server_ctx;
  SilentServer server(server_ctx);
  CapturedLog log;
  Recorder rec;
  auto o = options();
  o.conninfo = server.conninfo();
  o.connect_timeout = 5000ms;  // far longer than one pass of the loop, even under load
  o.reconnect_backoff = 50ms;
  const std::string warning = "pg listener on channel " + o.channel;
  std::shared_ptr<pg::Listener> listener;
  std::atomic<bool> probed{false};
  bool attempt_pending_at_probe = false;
  server.on_accept = [&] {
    asio::post(ctx, [&] {
      if (probed) return;
      attempt_pending_at_probe = log.count(warning) == 0 && !listener->listening();
      probed = true;
    });
  };
  listener = start(ctx, rec, o);
  std::thread server_thread([&] { server_ctx.run(); });
  const bool ran = run_until(ctx, [&] { return probed.load(); }, 20000ms);
  listener->stop();
  run_for(ctx, 20ms);
  server_ctx.stop();
  server_thread.join();
  REQUIRE(ran);
  CHECK(attempt_pending_at_probe);
  CHECK(rec.states.empty());
}

TEST_CASE("an unreachable server: retried with backoff, one warning, the secret never logged") {
  asio::io_context ctx;
  SilentServer server(ctx);
  CapturedLog log;
  Recorder rec;
  auto o = options();
  o.conninfo = server.conninfo();
  o.connect_timeout = 150ms;
  o.reconnect_backoff = 50ms;
  auto listener = start(ctx, rec, o);
  const auto began = SteadyClock::now();
  REQUIRE(run_until(ctx, [&] { return server.held.size() >= 4; }, 5000ms));
  const auto elapsed = test::elapsed_since(began);
  // 4 attempts take at least 3 x (150 + 50) ms (a lower bound: load only adds to it).
  CHECK(elapsed >= 550ms);
  CHECK(rec.states.empty());
  CHECK_FALSE(listener->listening());
  CHECK(log.count("pg listener on channel " + o.channel) == 1);
  CHECK(log.count("sekrit-pw") == 0);
  listener->stop();
  run_for(ctx, 20ms);
}
