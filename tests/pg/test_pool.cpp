// The async pool against a real PostgreSQL (DATABASE_URL): connecting, prepared
// statements, deadlines on both sides, pool limits, outage and recovery, and proof that
// nothing blocks the event loop.
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <variant>

#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "pg/pg_test_support.hpp"
#include "pg/pool.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

pg::PoolOptions options(std::size_t size = 2) {
  pg::PoolOptions o;
  o.conninfo = test::database_url();
  o.size = size;
  o.connect_timeout = 3000ms;
  o.statement_timeout = 2000ms;
  o.acquire_timeout = 1000ms;
  o.reconnect_backoff = 200ms;
  o.deadline_margin = 300ms;
  o.application_name = "idem-pg-test";
  return o;
}

result<pg::Result> query(asio::io_context& ctx, const std::shared_ptr<pg::Pool>& pool,
                         const std::string& sql) {
  return test::run(ctx, pool->query(sql));
}

std::string backend_pid(asio::io_context& ctx, const std::shared_ptr<pg::Pool>& pool) {
  auto r = query(ctx, pool, "SELECT pg_backend_pid()");
  REQUIRE(r);
  return std::string(r->value(0, 0));
}

struct Ticked {
  result<pg::Result> r = make_error_code(pg::errc::protocol);
  int ticks = 0;
  Millis elapsed{0};
};

asio::awaitable<Ticked> query_while_ticking(std::shared_ptr<pg::Pool> pool, std::string sql) {
  auto ex = co_await asio::this_coro::executor;
  auto ticker = std::make_shared<test::Ticker>(ex);
  asio::co_spawn(ex, test::tick(ticker), asio::detached);
  const auto start = SteadyClock::now();
  Ticked out;
  out.r = co_await pool->query(sql);
  out.elapsed = test::elapsed_since(start);
  out.ticks = ticker->ticks;
  ticker->stop = true;
  ticker->timer.cancel();
  co_return out;
}

// A TCP listener that completes the handshake (kernel backlog) and then never answers:
// libpq's startup waits forever, so only our connect deadline can end it.
struct SilentServer {
  explicit SilentServer(asio::io_context& ctx)
      : acceptor(ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    acceptor.listen();
  }
  std::string conninfo() const {
    return "host=127.0.0.1 port=" + std::to_string(acceptor.local_endpoint().port()) +
           " user=postgres dbname=postgres sslmode=disable";
  }
  asio::ip::tcp::acceptor acceptor;
};

// Restarts the throwaway server whatever happens in an outage test, so later tests and
// the other suites find it up.
struct ServerGuard {
  bool stopped = false;
  void stop() {
    test::pgctl_run("stop");
    stopped = true;
  }
  void start() {
    test::pgctl_run("start");
    stopped = false;
  }
  ~ServerGuard() {
    if (stopped) {
      try {
        test::pgctl_run("start");
      } catch (...) {
      }
    }
  }
};

}  // namespace

TEST_CASE("connections open lazily and are reused") {
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(2));
  CHECK(pool->open_connections() == 0);
  const std::string pid = backend_pid(ctx, pool);
  CHECK(backend_pid(ctx, pool) == pid);
  CHECK(backend_pid(ctx, pool) == pid);
  CHECK(pool->open_connections() == 1);
  CHECK(pool->idle_connections() == 1);
}

TEST_CASE("each session gets its timeouts and application_name") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.statement_timeout = 1500ms;
  opts.deadline_margin = 500ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  auto r = query(ctx, pool,
                 "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
                 " current_setting('idle_in_transaction_session_timeout'),"
                 " current_setting('application_name'), current_setting('bytea_output')");
  REQUIRE(r);
  CHECK(r->value(0, 0) == "1500ms");
  CHECK(r->value(0, 1) == "1500ms");
  CHECK(r->value(0, 2) == "2s");
  CHECK(r->value(0, 3) == "idem-pg-test");
  CHECK(r->value(0, 4) == "hex");
}

TEST_CASE("the options' session settings are made on every new connection, and refused ones fail it") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.settings = {{"enable_seqscan", "off"}, {"work_mem", "2MB"}};
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  auto r = query(ctx, pool, "SELECT current_setting('enable_seqscan'), current_setting('work_mem')");
  REQUIRE(r);
  CHECK(r->value(0, 0) == "off");
  CHECK(r->value(0, 1) == "2MB");
  // A replaced connection gets them too.
  const auto first = backend_pid(ctx, pool);
  test::Db admin(test::database_url());
  admin.exec("SELECT pg_terminate_backend($1::int)", {first});
  auto again = query(ctx, pool, "SELECT current_setting('enable_seqscan'), pg_backend_pid()");
  if (!again) again = query(ctx, pool, "SELECT current_setting('enable_seqscan'), pg_backend_pid()");
  REQUIRE(again);
  CHECK(again->value(0, 1) != first);
  CHECK(again->value(0, 0) == "off");
  // A setting the server refuses fails the connection's setup, as a bad statement does.
  auto bad = options(1);
  bad.settings = {{"enable_seqscan", "sideways"}};
  auto bad_pool = pg::Pool::create(ctx.get_executor(), bad);
  CHECK(!query(ctx, bad_pool, "SELECT 1"));
}

TEST_CASE("prepared statements take text, NULL and binary parameters") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.statements = {
      {"echo",
       "SELECT $1::text AS t, $2::bigint AS n, $3::bytea AS b, $4::text IS NULL AS was_null,"
       " $5::boolean AS flag, NULL::text AS nothing"},
      {"count_rows", "SELECT count(*) FROM generate_series(1, $1::integer)"},
  };
  auto pool = pg::Pool::create(ctx.get_executor(), opts);

  const std::string text = "héllo 'quoted' \"double\" \\ back";
  const std::string binary("\0\x01\xff\x80 bytes\0", 11);
  std::vector<pg::Param> params{pg::Param::text(text), pg::Param::text("-42"),
                                pg::Param::bytes(binary), pg::Param::null_value(),
                                pg::Param::text("true")};
  auto r = test::run(ctx, pool->execute("echo", params));
  REQUIRE(r);
  REQUIRE(r->rows() == 1);
  CHECK(r->columns() == 6);
  CHECK(r->column("t") == 0);
  CHECK(r->column("flag") == 4);
  CHECK(r->column("missing") == -1);
  CHECK(r->value(0, 0) == text);
  CHECK(r->int64(0, 1) == -42);
  CHECK(r->bytea(0, 2) == binary);
  CHECK(r->boolean(0, 3) == true);
  CHECK(r->boolean(0, 4) == true);
  CHECK(r->is_null(0, 5));
  CHECK_FALSE(r->int64(0, 5));
  CHECK(r->value(0, 5).empty());

  // An empty binary parameter is an empty bytea, not NULL.
  std::vector<pg::Param> empty{pg::Param::text(""), pg::Param::text("0"), pg::Param::bytes(""),
                               pg::Param::text("x"), pg::Param::text("false")};
  auto e = test::run(ctx, pool->execute("echo", empty));
  REQUIRE(e);
  CHECK_FALSE(e->is_null(0, 2));
  CHECK(e->bytea(0, 2) == std::string());
  CHECK(e->boolean(0, 3) == false);

  auto c = test::run(ctx, pool->execute("count_rows", {pg::Param::text("7")}));
  REQUIRE(c);
  CHECK(c->int64(0, 0) == 7);
}

TEST_CASE("affected_rows reports what a command changed") {
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(1));
  REQUIRE(query(ctx, pool, "CREATE TEMP TABLE t (x integer)"));
  auto ins = query(ctx, pool, "INSERT INTO t SELECT generate_series(1, 3)");
  REQUIRE(ins);
  CHECK(ins->affected_rows() == 3);
  auto del = test::run(ctx, pool->query("DELETE FROM t WHERE x >= $1::integer",
                                        {pg::Param::text("2")}));
  REQUIRE(del);
  CHECK(del->affected_rows() == 2);
  auto sel = query(ctx, pool, "SELECT x FROM t");
  REQUIRE(sel);
  CHECK(sel->rows() == 1);
}

TEST_CASE("SQL errors carry their SQLSTATE and keep the connection") {
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(1));
  const std::string pid = backend_pid(ctx, pool);

  auto r = query(ctx, pool, "SELECT 1 / 0");
  REQUIRE_FALSE(r);
  CHECK(pg::sqlstate(r.error()) == "22012");
  CHECK(pg::to_store_errc(r.error()) == errc::store_protocol);
  CHECK(pool->last_error_message().find("division by zero") != std::string::npos);

  auto missing = test::run(ctx, pool->execute("no_such_statement", {}));
  REQUIRE_FALSE(missing);
  CHECK(pg::sqlstate(missing.error()) == "26000");

  auto two = query(ctx, pool, "SELECT 1; SELECT 2");
  REQUIRE_FALSE(two);
  CHECK(pg::sqlstate(two.error()) == "42601");

  // A NUL in a text parameter is refused before anything is sent.
  const std::string with_nul("a\0b", 3);
  auto nul = test::run(ctx, pool->query("SELECT $1::text", {pg::Param::text(with_nul)}));
  REQUIRE_FALSE(nul);
  CHECK(nul.error() == pg::errc::invalid_parameter);

  CHECK(backend_pid(ctx, pool) == pid);
  CHECK(pool->open_connections() == 1);
}

TEST_CASE("the server's statement_timeout cancels a slow statement; the connection survives") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.statement_timeout = 200ms;
  opts.deadline_margin = 2000ms;  // the server side must fire first here
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  const std::string pid = backend_pid(ctx, pool);

  const auto start = SteadyClock::now();
  auto r = query(ctx, pool, "SELECT pg_sleep(5)");
  const auto took = test::elapsed_since(start);
  REQUIRE_FALSE(r);
  CHECK(pg::sqlstate(r.error()) == "57014");
  CHECK(pg::to_store_errc(r.error()) == errc::store_timeout);
  CHECK(took >= 150ms);
  CHECK(took < 1500ms);
  CHECK(backend_pid(ctx, pool) == pid);
}

TEST_CASE("lock_timeout bounds a lock wait as a store timeout") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.statement_timeout = 300ms;
  opts.deadline_margin = 1000ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  test::Db holder(test::database_url());
  holder.exec("SELECT pg_advisory_lock(915001)");

  // Both timeouts are equal, so the statement's own (started first) normally wins...
  auto r = query(ctx, pool, "SELECT pg_advisory_lock(915001)");
  REQUIRE_FALSE(r);
  CHECK(pg::sqlstate(r.error()) == "57014");
  CHECK(pg::to_store_errc(r.error()) == errc::store_timeout);

  // ...and lock_timeout still bounds a lock wait when statement_timeout is off.
  REQUIRE(query(ctx, pool, "SET statement_timeout = 0"));
  auto l = query(ctx, pool, "SELECT pg_advisory_lock(915001)");
  holder.exec("SELECT pg_advisory_unlock(915001)");
  REQUIRE_FALSE(l);
  CHECK(pg::sqlstate(l.error()) == "55P03");
  CHECK(pg::to_store_errc(l.error()) == errc::store_timeout);
}

TEST_CASE("the client deadline ends a statement the server does not cancel") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.statement_timeout = 300ms;
  opts.deadline_margin = 200ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  // Switch the server-side timeout off on this session, so only the client deadline
  // (statement_timeout + margin = 500 ms) can end the sleep.
  REQUIRE(query(ctx, pool, "SET statement_timeout = 0"));
  const std::string pid = backend_pid(ctx, pool);

  auto t = test::run(ctx, query_while_ticking(pool, "SELECT pg_sleep(5)"));
  REQUIRE_FALSE(t.r);
  CHECK(t.r.error() == pg::errc::timeout);
  CHECK(pg::to_store_errc(t.r.error()) == errc::store_timeout);
  CHECK(t.elapsed >= 450ms);
  CHECK(t.elapsed < 2000ms);
  CHECK(t.ticks >= 20);  // the loop kept running while the call waited
  // The timed-out connection was closed, not returned...
  CHECK(pool->open_connections() == 0);
  // ...and the next call gets a fresh one.
  CHECK(backend_pid(ctx, pool) != pid);
}

TEST_CASE("a slow statement does not block the event loop") {
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(1));
  REQUIRE(query(ctx, pool, "SELECT 1"));  // connected beforehand: measure the statement
  auto t = test::run(ctx, query_while_ticking(pool, "SELECT pg_sleep(0.5)"));
  REQUIRE(t.r);
  CHECK(t.elapsed >= 450ms);
  // 10 ms ticks over >= 500 ms: ~50 if nothing blocked; a blocking call would leave ~0.
  CHECK(t.ticks >= 25);
}

TEST_CASE("connecting does not block the event loop and obeys connect_timeout") {
  asio::io_context ctx;
  SilentServer silent(ctx);
  auto opts = options(1);
  opts.conninfo = silent.conninfo();
  opts.connect_timeout = 400ms;
  opts.reconnect_backoff = 2000ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);

  auto t = test::run(ctx, query_while_ticking(pool, "SELECT 1"));
  REQUIRE_FALSE(t.r);
  CHECK(t.r.error() == pg::errc::timeout);
  CHECK(t.elapsed >= 350ms);
  CHECK(t.elapsed < 1500ms);
  CHECK(t.ticks >= 20);
  CHECK(pool->open_connections() == 0);

  // Within reconnect_backoff the pool answers at once with the same failure.
  const auto start = SteadyClock::now();
  auto again = query(ctx, pool, "SELECT 1");
  REQUIRE_FALSE(again);
  CHECK(again.error() == pg::errc::timeout);
  CHECK(test::elapsed_since(start) < 100ms);
}

TEST_CASE("a refused connection fails fast as unavailable") {
  asio::io_context ctx;
  // Bind and close a listener to get a port nobody listens on.
  std::uint16_t port = 0;
  {
    asio::ip::tcp::acceptor a(ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  auto opts = options(1);
  opts.conninfo = "host=127.0.0.1 port=" + std::to_string(port) + " user=postgres dbname=x";
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  const auto start = SteadyClock::now();
  auto r = query(ctx, pool, "SELECT 1");
  REQUIRE_FALSE(r);
  CHECK(r.error() == pg::errc::connection_failed);
  CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
  CHECK(test::elapsed_since(start) < 1000ms);
  CHECK_FALSE(pool->last_error_message().empty());
}

TEST_CASE("host names are resolved without blocking; multi-host lists keep libpq's order") {
  asio::io_context ctx;
  const std::string port = std::to_string(
      std::stoi(test::Db(test::database_url()).scalar("SHOW port").value()));
  std::uint16_t closed_port = 0;
  {
    asio::ip::tcp::acceptor a(ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    closed_port = a.local_endpoint().port();
  }

  SUBCASE("a name: every address is tried in turn") {
    // localhost may resolve to ::1 first, where the test server does not listen.
    auto opts = options(1);
    opts.conninfo = "host=localhost port=" + port + " user=postgres dbname=postgres";
    auto pool = pg::Pool::create(ctx.get_executor(), opts);
    auto r = query(ctx, pool, "SELECT inet_server_addr()::text");
    REQUIRE(r);
    CHECK(r->value(0, 0) == "127.0.0.1/32");
  }
  SUBCASE("a list of hosts with per-host ports fails over") {
    auto opts = options(1);
    opts.conninfo = "postgresql://postgres@localhost:" + std::to_string(closed_port) +
                    ",127.0.0.1:" + port + "/postgres";
    auto pool = pg::Pool::create(ctx.get_executor(), opts);
    REQUIRE(query(ctx, pool, "SELECT 1"));
  }
  SUBCASE("a name that does not resolve is a failed connect") {
    auto opts = options(1);
    opts.conninfo = "host=no-such-host.invalid port=" + port + " user=postgres dbname=postgres";
    auto pool = pg::Pool::create(ctx.get_executor(), opts);
    auto r = query(ctx, pool, "SELECT 1");
    REQUIRE_FALSE(r);
    CHECK(r.error() == pg::errc::connection_failed);
    CHECK(pool->last_error_message().find("no-such-host.invalid") != std::string::npos);
  }
}

// The failover case: the first host of the list is a primary that vanished without a RST
// (a crashed machine, a partition), the second the promoted standby.
TEST_CASE("multi-host: a host that never answers costs its own connect_timeout, then the next serves") {
  asio::io_context ctx;
  SilentServer silent(ctx);
  const std::string port = std::to_string(
      std::stoi(test::Db(test::database_url()).scalar("SHOW port").value()));
  auto opts = options(1);
  opts.connect_timeout = 400ms;
  opts.conninfo = "postgresql://postgres@127.0.0.1:" +
                  std::to_string(silent.acceptor.local_endpoint().port()) + ",127.0.0.1:" + port +
                  "/postgres?sslmode=disable&target_session_attrs=read-write";
  auto pool = pg::Pool::create(ctx.get_executor(), opts);

  auto t = test::run(ctx, query_while_ticking(pool, "SELECT inet_server_port()"));
  REQUIRE_MESSAGE(t.r, pool->last_error_message());
  CHECK(std::to_string(t.r->int64(0, 0).value_or(0)) == port);
  CHECK(t.elapsed >= 350ms);   // the silent host had its whole budget
  CHECK(t.elapsed < 1500ms);   // and no more
  CHECK(t.ticks >= 20);        // without blocking the event loop

}

TEST_CASE("multi-host: a server that refuses the startup (out of slots) does not end the list") {
  // libpq, given the whole list, stops at the first server that answers with an error.
  test::FatalServer starting;
  asio::io_context ctx;
  const std::string port = std::to_string(
      std::stoi(test::Db(test::database_url()).scalar("SHOW port").value()));
  auto opts = options(1);
  opts.conninfo = "postgresql://postgres@127.0.0.1:" + std::to_string(starting.port()) +
                  ",127.0.0.1:" + port +
                  "/postgres?sslmode=disable&gssencmode=disable&target_session_attrs=read-write";
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  auto r = query(ctx, pool, "SELECT inet_server_port()");
  REQUIRE_MESSAGE(r, pool->last_error_message());
  CHECK(std::to_string(r->int64(0, 0).value_or(0)) == port);
  CHECK(starting.answered() == 1);  // it was asked first, and said no

  SUBCASE("alone, its refusal is the call's failure, with the server's words") {
    opts.conninfo = "postgresql://postgres@127.0.0.1:" + std::to_string(starting.port()) +
                    "/postgres?sslmode=disable&gssencmode=disable";
    auto alone = pg::Pool::create(ctx.get_executor(), opts);
    auto failed = query(ctx, alone, "SELECT 1");
    REQUIRE_FALSE(failed);
    CHECK(pg::to_store_errc(failed.error()) == errc::store_unavailable);
    CHECK(alone->last_error_message().find("too many clients") != std::string::npos);
  }
}

TEST_CASE("multi-host: every host silent, each gets its budget, the call fails as a timeout") {
  asio::io_context ctx;
  SilentServer first(ctx);
  SilentServer second(ctx);
  auto opts = options(1);
  opts.connect_timeout = 400ms;
  opts.conninfo = "host=127.0.0.1,127.0.0.1 port=" +
                  std::to_string(first.acceptor.local_endpoint().port()) + "," +
                  std::to_string(second.acceptor.local_endpoint().port()) +
                  " user=postgres dbname=postgres sslmode=disable";
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  const auto start = SteadyClock::now();
  auto r = query(ctx, pool, "SELECT 1");
  REQUIRE_FALSE(r);
  CHECK(r.error() == pg::errc::timeout);
  CHECK(test::elapsed_since(start) >= 750ms);
  CHECK(test::elapsed_since(start) < 2500ms);
  // Both hosts are named in the message.
  CHECK(pool->last_error_message().find(std::to_string(first.acceptor.local_endpoint().port())) !=
        std::string::npos);
  CHECK(pool->last_error_message().find(std::to_string(second.acceptor.local_endpoint().port())) !=
        std::string::npos);
}

TEST_CASE("multi-host: prefer-standby takes a standby first, else any server, in order") {
  asio::io_context ctx;
  std::uint16_t closed_port = 0;
  {
    asio::ip::tcp::acceptor a(ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    closed_port = a.local_endpoint().port();
  }
  const std::string port = std::to_string(
      std::stoi(test::Db(test::database_url()).scalar("SHOW port").value()));
  auto opts = options(1);
  // No standby anywhere: the first pass (standby only) finds none, the second takes the
  // first server that answers.
  opts.conninfo = "postgresql://postgres@127.0.0.1:" + std::to_string(closed_port) +
                  ",127.0.0.1:" + port + "/postgres?target_session_attrs=prefer-standby";
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  auto r = query(ctx, pool, "SELECT NOT pg_is_in_recovery()");
  REQUIRE_MESSAGE(r, pool->last_error_message());
  CHECK(r->boolean(0, 0) == true);
}

TEST_CASE("a server that takes no writes: read-write refuses it; a write on it drops the session") {
  // A database whose sessions start read-only is, to libpq and to the sidecar, exactly a
  // server that is not the primary (a standby, or a primary being demoted).
  test::ScratchDatabase scratch("idem_pg_readonly");
  test::Db admin(test::database_url());
  admin.exec("ALTER DATABASE " + scratch.name() + " SET default_transaction_read_only = on");
  asio::io_context ctx;

  SUBCASE("target_session_attrs=read-write: no session at all") {
    auto opts = options(1);
    opts.conninfo = scratch.url() + (scratch.url().find('?') == std::string::npos ? "?" : "&") +
                    "target_session_attrs=read-write";
    auto pool = pg::Pool::create(ctx.get_executor(), opts);
    auto r = query(ctx, pool, "SELECT 1");
    REQUIRE_FALSE(r);
    CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
    CHECK(pool->last_error_message().find("read-only") != std::string::npos);
  }
  SUBCASE("without it: the write fails as unavailable and the session is not kept") {
    auto opts = options(1);
    opts.conninfo = scratch.url();
    auto pool = pg::Pool::create(ctx.get_executor(), opts);
    REQUIRE(query(ctx, pool, "SELECT 1"));
    REQUIRE(pool->open_connections() == 1);
    auto r = query(ctx, pool, "CREATE TABLE t_readonly (x int)");
    REQUIRE_FALSE(r);
    CHECK(pg::sqlstate(r.error()) == "25006");
    CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
    // The next call opens a new session, which could be on the new primary.
    CHECK(pool->open_connections() == 0);
  }
}

TEST_CASE("an exhausted pool answers pool_exhausted within acquire_timeout") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.acquire_timeout = 200ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);

  auto slow = asio::co_spawn(ctx, pool->query("SELECT pg_sleep(1)"), asio::use_future);
  auto waiter = [](std::shared_ptr<pg::Pool> p) -> asio::awaitable<std::pair<result<pg::Result>, Millis>> {
    const auto start = SteadyClock::now();
    auto r = co_await p->query("SELECT 1");
    co_return std::pair{std::move(r), test::elapsed_since(start)};
  };
  auto busy = asio::co_spawn(ctx, waiter(pool), asio::use_future);
  ctx.run();

  auto [r, took] = busy.get();
  REQUIRE_FALSE(r);
  CHECK(r.error() == pg::errc::pool_exhausted);
  CHECK(pg::to_store_errc(r.error()) == errc::store_busy);
  CHECK(took >= 150ms);
  CHECK(took < 800ms);
  CHECK(slow.get());
  CHECK(pool->open_connections() == 1);
}

TEST_CASE("waiters are handed connections as they free up") {
  asio::io_context ctx;
  auto opts = options(2);
  opts.acquire_timeout = 5000ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  std::vector<std::future<result<pg::Result>>> calls;
  for (int i = 0; i < 12; ++i) {
    calls.push_back(asio::co_spawn(ctx, pool->query("SELECT pg_sleep(0.02)"), asio::use_future));
  }
  ctx.run();
  for (auto& c : calls) CHECK(c.get());
  CHECK(pool->open_connections() == 2);
  CHECK(pool->idle_connections() == 2);
}

TEST_CASE("a cancelled call closes its connection and leaves the pool consistent") {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(1));
  const std::string pid = backend_pid(ctx, pool);
  auto race = [](std::shared_ptr<pg::Pool> p) -> asio::awaitable<std::size_t> {
    asio::steady_timer t(co_await asio::this_coro::executor, 100ms);
    auto winner = co_await (p->query("SELECT pg_sleep(5)") || t.async_wait(asio::use_awaitable));
    co_return winner.index();
  };
  const auto start = SteadyClock::now();
  CHECK(test::run(ctx, race(pool)) == 1);  // the timer won
  CHECK(test::elapsed_since(start) < 1000ms);
  CHECK(pool->open_connections() == 0);
  CHECK(backend_pid(ctx, pool) != pid);
}

TEST_CASE("destroying the io_context with a call suspended releases everything") {
  auto ctx = std::make_unique<asio::io_context>();
  std::weak_ptr<pg::Pool> weak;
  {
    auto pool = pg::Pool::create(ctx->get_executor(), options(1));
    weak = pool;
    asio::co_spawn(*ctx, pool->query("SELECT pg_sleep(2)"), asio::detached);
  }
  ctx->run_for(300ms);          // connected, statement sent, waiting for the answer
  CHECK_FALSE(weak.expired());  // the suspended call keeps its pool alive
  ctx.reset();                  // shutdown destroys the suspended coroutine
  CHECK(weak.expired());        // ...which returned its connection and freed the pool
}

TEST_CASE("close() refuses new calls") {
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), options(1));
  REQUIRE(query(ctx, pool, "SELECT 1"));
  pool->close();
  CHECK(pool->open_connections() == 0);
  auto r = query(ctx, pool, "SELECT 1");
  REQUIRE_FALSE(r);
  CHECK(r.error() == pg::errc::pool_closed);
}

TEST_CASE("invalid options are refused at creation") {
  asio::io_context ctx;
  auto opts = options(1);
  opts.size = 0;
  CHECK_THROWS_AS(pg::Pool::create(ctx.get_executor(), opts), std::invalid_argument);
  opts = options(1);
  opts.statement_timeout = 0ms;
  CHECK_THROWS_AS(pg::Pool::create(ctx.get_executor(), opts), std::invalid_argument);
}

TEST_CASE("server outage: errors come quickly, then the same pool recovers") {
  if (test::pgctl().empty()) {
    // Stopping a server that is not a throwaway one would be destructive.
    WARN_MESSAGE(false, "IDEM_TEST_PGCTL is not set: outage test not run");
    return;
  }
  asio::io_context ctx;
  auto opts = options(2);
  opts.statement_timeout = 20000ms;  // the in-flight sleep must outlive the shutdown
  opts.reconnect_backoff = 200ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  REQUIRE(query(ctx, pool, "SELECT 1"));
  ServerGuard server;

  SUBCASE("a statement in flight when the server stops fails as unavailable") {
    auto inflight = asio::co_spawn(ctx, pool->query("SELECT pg_sleep(30)"), asio::use_future);
    ctx.restart();
    std::thread loop([&] { ctx.run(); });
    // Wait (with a deadline) until the sleep is really running on the server.
    {
      test::Db probe(test::database_url());
      const auto until = SteadyClock::now() + 5s;
      while (SteadyClock::now() < until &&
             probe.scalar("SELECT count(*) FROM pg_stat_activity "
                          "WHERE application_name = 'idem-pg-test' AND query LIKE 'SELECT pg_sleep(30)%'") != "1") {
        std::this_thread::sleep_for(10ms);
      }
    }
    server.stop();
    auto r = inflight.get();
    loop.join();
    REQUIRE_FALSE(r);
    CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
    CHECK(pool->open_connections() == 0);
  }

  SUBCASE("idle connections are found dead; the call fails without waiting") {
    // Two idle connections, both killed by the shutdown.
    auto a = asio::co_spawn(ctx, pool->query("SELECT pg_sleep(0.05)"), asio::use_future);
    auto b = asio::co_spawn(ctx, pool->query("SELECT pg_sleep(0.05)"), asio::use_future);
    ctx.restart();
    ctx.run();
    REQUIRE(a.get());
    REQUIRE(b.get());
    REQUIRE(pool->idle_connections() == 2);
    server.stop();
    const auto start = SteadyClock::now();
    auto r = query(ctx, pool, "SELECT 1");
    REQUIRE_FALSE(r);
    CHECK(r.error() == pg::errc::connection_failed);
    CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
    CHECK(test::elapsed_since(start) < 500ms);
    CHECK(pool->open_connections() == 0);
  }

  // While down, every call answers quickly (fail-fast window or refused connect).
  for (int i = 0; i < 5; ++i) {
    const auto start = SteadyClock::now();
    auto r = query(ctx, pool, "SELECT 1");
    REQUIRE_FALSE(r);
    CHECK(pg::to_store_errc(r.error()) == errc::store_unavailable);
    CHECK(test::elapsed_since(start) < 500ms);
  }

  server.start();
  // Poll with a deadline: the first call after the backoff window reconnects.
  result<pg::Result> r = make_error_code(pg::errc::protocol);
  const auto until = SteadyClock::now() + 10s;
  while (SteadyClock::now() < until) {
    r = query(ctx, pool, "SELECT 42");
    if (r) break;
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(r);
  CHECK(r->int64(0, 0) == 42);
  CHECK(pool->open_connections() >= 1);
}

TEST_CASE("a pipeline runs its statements in one round trip, in order, as one transaction") {
  test::Db sql(test::database_url());
  sql.exec("CREATE TABLE IF NOT EXISTS idem_pipeline_test (x integer PRIMARY KEY)");
  sql.exec("TRUNCATE idem_pipeline_test");

  asio::io_context ctx;
  auto opts = options(1);
  opts.statements = {
      {"put", "INSERT INTO idem_pipeline_test VALUES ($1::integer) RETURNING x"},
      {"count", "SELECT count(*) FROM idem_pipeline_test WHERE x >= $1::integer"},
      {"divide", "SELECT 10 / $1::integer"},
  };
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  const std::string pid = backend_pid(ctx, pool);

  SUBCASE("every result, in order; a later statement sees an earlier one's row") {
    std::vector<pg::Pool::Batched> batch;
    batch.push_back({"put", {pg::Param::text("1")}});
    batch.push_back({"put", {pg::Param::text("2")}});
    batch.push_back({"count", {pg::Param::text("1")}});
    auto r = test::run(ctx, pool->execute_pipeline(std::move(batch)));
    REQUIRE(r.has_value());
    REQUIRE(r->size() == 3);
    CHECK((*r)[0].int64(0, 0) == 1);
    CHECK((*r)[1].int64(0, 0) == 2);
    CHECK((*r)[2].int64(0, 0) == 2);
    CHECK(sql.scalar("SELECT count(*) FROM idem_pipeline_test") == "2");  // committed
  }

  SUBCASE("one failing statement fails the batch and rolls back the others") {
    std::vector<pg::Pool::Batched> batch;
    batch.push_back({"put", {pg::Param::text("3")}});
    batch.push_back({"divide", {pg::Param::text("0")}});
    batch.push_back({"put", {pg::Param::text("4")}});
    auto r = test::run(ctx, pool->execute_pipeline(std::move(batch)));
    REQUIRE_FALSE(r.has_value());
    CHECK(pg::sqlstate(r.error()) == "22012");
    CHECK(sql.scalar("SELECT count(*) FROM idem_pipeline_test") == "0");

    // The same connection goes on, in and out of pipeline mode.
    std::vector<pg::Pool::Batched> next;
    next.push_back({"divide", {pg::Param::text("5")}});
    auto ok = test::run(ctx, pool->execute_pipeline(std::move(next)));
    REQUIRE(ok.has_value());
    CHECK((*ok)[0].int64(0, 0) == 2);
    auto single = test::run(ctx, pool->execute("divide", {pg::Param::text("2")}));
    REQUIRE(single);
    CHECK(single->int64(0, 0) == 5);
  }

  SUBCASE("a failing commit fails the batch") {
    // Deferred: the duplicate is only found at commit, after both statements succeeded.
    sql.exec("ALTER TABLE idem_pipeline_test DROP CONSTRAINT IF EXISTS idem_pipeline_test_pkey");
    sql.exec("ALTER TABLE idem_pipeline_test ADD CONSTRAINT idem_pipeline_test_pkey"
             " PRIMARY KEY (x) DEFERRABLE INITIALLY DEFERRED");
    std::vector<pg::Pool::Batched> batch;
    batch.push_back({"put", {pg::Param::text("7")}});
    batch.push_back({"put", {pg::Param::text("7")}});
    auto r = test::run(ctx, pool->execute_pipeline(std::move(batch)));
    REQUIRE_FALSE(r.has_value());
    CHECK(pg::sqlstate(r.error()) == "23505");
    CHECK(sql.scalar("SELECT count(*) FROM idem_pipeline_test") == "0");
    sql.exec("ALTER TABLE idem_pipeline_test DROP CONSTRAINT idem_pipeline_test_pkey");
    sql.exec("ALTER TABLE idem_pipeline_test ADD PRIMARY KEY (x)");
  }

  CHECK(backend_pid(ctx, pool) == pid);
  CHECK(pool->open_connections() == 1);
  sql.exec("DROP TABLE IF EXISTS idem_pipeline_test");
}
