// The harness's own checks: process control, HTTP clients, the database helper and the
// test backend, exercised without the sidecar. If these fail, an end-to-end failure says
// nothing about idemproxy.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <string>
#include <vector>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include "support/harness.hpp"

namespace it = idem::it;
using namespace std::chrono_literals;

namespace {

it::Headers tenant(std::string t = "t1") { return {{"X-Tenant-Id", std::move(t)}}; }

std::int64_t elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               since)
      .count();
}

}  // namespace

TEST_SUITE("harness") {

TEST_CASE("Process: exit code, output, environment and log tail") {
  it::Process p("/bin/sh",
                {"-c", "echo out-$FOO; echo err >&2; for i in 1 2 3; do echo line$i; done; "
                       "exit 3"},
                {{"FOO", "bar"}});
  auto status = p.wait_exit(5s);
  REQUIRE(status);
  CHECK(status->exited());
  CHECK(status->code() == 3);
  CHECK_FALSE(p.running());
  const std::string log = p.log();
  CHECK(log.find("out-bar\n") != std::string::npos);
  CHECK(log.find("err\n") != std::string::npos);
  CHECK(p.log_tail(2) == "line2\nline3\n");
}

TEST_CASE("Process: unset variables, signals, wait timeout and kill") {
  ::setenv("IDEM_HARNESS_PROBE", "visible", 1);
  it::Process shown("/bin/sh", {"-c", "echo probe=$IDEM_HARNESS_PROBE"});
  it::Process hidden(it::ProcessOptions{.executable = "sh",  // through PATH
                                        .args = {"-c", "echo probe=$IDEM_HARNESS_PROBE"},
                                        .unset = {"IDEM_HARNESS_PROBE"}});
  REQUIRE(shown.wait_exit(5s));
  REQUIRE(hidden.wait_exit(5s));
  CHECK(shown.log() == "probe=visible\n");
  CHECK(hidden.log() == "probe=\n");
  ::unsetenv("IDEM_HARNESS_PROBE");

  it::Process sleeper("/bin/sleep", {"30"});
  CHECK(sleeper.running());
  CHECK_FALSE(sleeper.wait_exit(50ms));  // still running: no status, no exception
  sleeper.signal(SIGTERM);
  auto status = sleeper.wait_exit(5s);
  REQUIRE(status);
  CHECK(status->signaled());
  CHECK(status->signal() == SIGTERM);
  CHECK(status->describe().find("signal 15") == 0);

  it::Process stubborn("/bin/sh", {"-c", "trap '' TERM; echo ready; sleep 30"});
  stubborn.wait_for_output("ready", 5s);
  stubborn.signal(SIGTERM);
  CHECK_FALSE(stubborn.wait_exit(100ms));
  CHECK(stubborn.kill().signal() == SIGKILL);
}

TEST_CASE("Process: start failures and early exits are reported clearly") {
  CHECK_THROWS_WITH_AS(it::Process("/nonexistent/binary", {}),
                       doctest::Contains("cannot start /nonexistent/binary"), it::Failure);
  it::Process quitter("/bin/sh", {"-c", "echo about to go; exit 4"});
  CHECK_THROWS_WITH_AS(quitter.wait_for_output("never printed", 5s),
                       doctest::Contains("about to go"), it::Failure);
  auto result = it::run_command({.executable = "/bin/echo", .args = {"hi"}}, 5s);
  CHECK(result.status.success());
  CHECK(result.output == "hi\n");
  CHECK_THROWS_AS(it::run_command({.executable = "/bin/sleep", .args = {"30"}}, 100ms),
                  it::Failure);
}

TEST_CASE("wait_until: returns when true, fails naming the condition") {
  int polls = 0;
  it::wait_until([&] { return ++polls == 3; }, 1s, "three polls");
  CHECK(polls == 3);
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(it::wait_until([] { return false; }, 100ms, "the impossible"),
                       doctest::Contains("waiting for: the impossible"), it::Failure);
  CHECK(elapsed_ms(started) >= 100);
}

TEST_CASE("ports: free_port is free, wait_for_port has a deadline") {
  const auto port = it::free_port();
  CHECK(port > 0);
  CHECK_FALSE(it::port_open(port));
  CHECK_THROWS_AS(it::wait_for_port(port, 100ms), it::Failure);
}

TEST_CASE("test backend: default answer, recorded call with headers in order") {
  it::TestBackend backend;
  it::HttpClient client(backend.port());
  const auto res = client.post("/orders?x=1", R"({"amount":10})",
                               {{"X-Tenant-Id", "acme"},
                                {"Idempotency-Key", "k-1"},
                                {"X-Idempotency-Attempt", "2"},
                                {"X-Idempotency-Operation-Id", "op-abc"},
                                {"X-Repeat", "a"},
                                {"x-repeat", "b"}});
  CHECK(res.status == 201);
  CHECK(res.header("content-type") == "application/json");
  const auto body = boost::json::parse(res.body).as_object();
  const auto seq = body.at("seq").as_int64();
  CHECK(body.at("order_id").as_string() == "ord-" + std::to_string(seq));
  CHECK(body.at("attempt").as_string() == "2");
  CHECK(body.at("operation_id").as_string() == "op-abc");
  CHECK(body.at("tenant").as_string() == "acme");
  CHECK(res.header("Location") == "/orders/ord-" + std::to_string(seq));
  CHECK(res.header("ETag") == "\"e" + std::to_string(seq) + "\"");
  CHECK(res.header("X-Backend-Seq") == std::to_string(seq));
  CHECK(res.headers_named("set-cookie") == std::vector<std::string>{"s=" + std::to_string(seq)});

  CHECK(client.get("/orders/1").status == 200);

  const auto calls = backend.wait_for_calls(2);
  REQUIRE(calls.size() == 2);
  const auto& call = calls[0];
  CHECK(call.seq == static_cast<std::uint64_t>(seq));
  CHECK(call.method == "POST");
  CHECK(call.target == "/orders?x=1");
  CHECK(call.body == R"({"amount":10})");
  CHECK(call.completed);
  CHECK(call.responded);
  CHECK_FALSE(call.client_gone);
  CHECK(call.status == 201);
  CHECK(call.header("idempotency-key") == "k-1");
  CHECK(call.headers_named("X-Repeat") == std::vector<std::string>{"a", "b"});
  // Order and spelling as sent: the client's headers, then Host and Content-Length.
  REQUIRE(call.headers.size() >= 6);
  CHECK(call.headers[0] == std::pair<std::string, std::string>{"X-Tenant-Id", "acme"});
  CHECK(call.headers[5] == std::pair<std::string, std::string>{"x-repeat", "b"});
  CHECK(calls[1].method == "GET");
  CHECK(calls[1].seq == call.seq + 1);

  backend.reset();
  CHECK(backend.calls().empty());
  client.post("/orders", "{}", tenant());
  CHECK(backend.wait_for_calls(1).at(0).seq == call.seq + 2);  // seq survives reset
}

TEST_CASE("test backend: status, body size and delay headers") {
  it::TestBackend backend;
  it::HttpClient client(backend.port());
  CHECK(client.post("/orders", "{}", {{"X-Test-Status", "503"}}).status == 503);
  CHECK(client.get("/x", {{"X-Test-Status", "204"}}).body.empty());
  const auto big = client.get("/x", {{"X-Test-Body-Size", "100000"}});
  CHECK(big.status == 200);
  CHECK(big.body == std::string(100000, 'x'));
  CHECK(client.get("/x", {{"X-Test-Status", "abc"}}).status == 400);

  const auto started = std::chrono::steady_clock::now();
  CHECK(client.get("/slow", {{"X-Test-Delay-Ms", "200"}}).status == 200);
  CHECK(elapsed_ms(started) >= 200);

  const auto calls = backend.wait_for_calls(5);
  CHECK(calls[0].status == 503);
  CHECK(calls[4].completed_us.value() - calls[4].arrived_us >= 200'000);
}

TEST_CASE("HttpClient: keep-alive reuse, reconnect after close, timeouts") {
  it::TestBackend backend;
  it::HttpClient client(backend.port());
  for (int i = 0; i < 3; ++i) {
    CHECK(client.get("/ping").status == 200);
  }
  CHECK(client.connections_opened() == 1);

  CHECK(client.get("/bye", {{"Connection", "close"}}).status == 200);
  CHECK_FALSE(client.connected());
  CHECK(client.get("/again").status == 200);
  CHECK(client.connections_opened() == 2);

  // The backend restarts on the same port: the idle connection is dead, the client notices
  // before sending and opens a new one.
  backend.restart();
  CHECK(client.get("/after-restart").status == 200);
  CHECK(client.connections_opened() == 3);

  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(client.get("/held", {{"X-Test-Hold", "never"}}, 200ms),
                       doctest::Contains("GET /held"), it::Failure);
  CHECK(elapsed_ms(started) < 5000);
  backend.release("never");
  CHECK(client.get("/next").status == 200);  // a fresh connection after the timeout
  CHECK(client.connections_opened() == 4);

  backend.stop();
  CHECK_THROWS_WITH_AS(client.get("/down"), doctest::Contains("connect failed"), it::Failure);
}

TEST_CASE("test backend: hold until release; releases are sticky until reset") {
  it::TestBackend backend;
  auto held = std::async(std::launch::async, [port = backend.port()] {
    return it::HttpClient(port).post("/orders", "{}", {{"X-Test-Hold", "h1"}});
  });
  auto call = backend.wait_for_calls(1).at(0);
  CHECK_FALSE(call.completed);
  CHECK(held.wait_for(50ms) == std::future_status::timeout);
  backend.release("h1");
  CHECK(held.get().status == 201);
  CHECK(backend.wait_for_call([](const auto& c) { return c.completed; }, "h1 completed")
            .responded);

  backend.release("h2");  // before the request: must not be lost
  it::HttpClient client(backend.port());
  CHECK(client.post("/orders", "{}", {{"X-Test-Hold", "h2"}}, 5s).status == 201);

  backend.reset();  // forgets h2's release
  CHECK_THROWS_AS(client.post("/orders", "{}", {{"X-Test-Hold", "h2"}}, 200ms), it::Failure);
  backend.release("h2");
  backend.wait_for_call([](const auto& c) { return c.completed; }, "the second h2 completed");
}

TEST_CASE("test backend: many connections at once, one release") {
  it::TestBackend backend;
  constexpr std::size_t n = 8;
  auto responses = [&] {
    auto waiter = std::async(std::launch::async, [&] {
      backend.wait_for_calls(n);
      backend.release("all");
    });
    auto out = it::concurrently(n, [port = backend.port()](std::size_t i) {
      return it::HttpClient(port).post("/orders", "{}",
                                       {{"X-Test-Hold", "all"}, {"X-Tenant-Id", std::to_string(i)}});
    });
    waiter.get();
    return out;
  }();
  it::require_all_ok(responses);
  std::set<std::string> order_ids;
  for (auto& r : responses) {
    CHECK(r.get().status == 201);
    order_ids.insert(r.get().header("Location").value());
  }
  CHECK(order_ids.size() == n);

  auto failing = it::concurrently(3, [](std::size_t i) {
    if (i == 1) {
      throw std::runtime_error("boom");
    }
  });
  CHECK(failing[0].ok());
  CHECK(failing[1].error_message() == "boom");
  CHECK_THROWS_WITH_AS(it::require_all_ok(failing), doctest::Contains("1 of 3"), it::Failure);
}

TEST_CASE("test backend: client gone while held is recorded") {
  it::TestBackend backend;
  it::RawConnection conn(backend.port());
  conn.send("POST /orders HTTP/1.1\r\nHost: x\r\nX-Test-Hold: gone\r\nContent-Length: 2\r\n\r\n{}");
  backend.wait_for_calls(1);
  conn.close();
  backend.release("gone");
  const auto call = backend.wait_for_call([](const auto& c) { return c.completed; },
                                          "the abandoned call to complete");
  CHECK(call.client_gone);
  CHECK_FALSE(call.responded);
  CHECK(call.status == 201);
}

TEST_CASE("test backend: close-before-response resets without answering") {
  it::TestBackend backend;
  const std::string raw = it::raw_exchange(
      backend.port(),
      "POST /orders HTTP/1.1\r\nHost: x\r\nX-Test-Close: before-response\r\n"
      "Content-Length: 2\r\n\r\n{}");
  CHECK(raw.empty());
  it::HttpClient client(backend.port());
  CHECK_THROWS_AS(client.post("/orders", "{}", {{"X-Test-Close", "before-response"}}),
                  it::Failure);
  const auto calls = backend.wait_for_calls(2);
  for (const auto& call : calls) {
    CHECK(call.completed);
    CHECK_FALSE(call.responded);
    CHECK(call.status == 0);
  }
}

TEST_CASE("raw_exchange and RawConnection: bytes in, bytes out") {
  it::TestBackend backend;
  const std::string raw =
      it::raw_exchange(backend.port(), "GET /raw HTTP/1.1\r\nHost: x\r\nX-Tenant-Id: r\r\n\r\n");
  const auto res = it::parse_response(raw);
  CHECK(res.status == 200);
  CHECK(res.body.find("\"tenant\":\"r\"") != std::string::npos);

  // Two pipelined requests: two responses, read one at a time.
  it::RawConnection conn(backend.port());
  conn.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const auto first = conn.read_response();
  const auto second = conn.read_response();
  CHECK(first.header("X-Backend-Seq").value() != second.header("X-Backend-Seq").value());
  CHECK_FALSE(second.keep_alive);
  CHECK(conn.wait_closed(2s));

  // Expect: 100-continue gets its interim answer before the body is sent.
  it::RawConnection expecting(backend.port());
  expecting.send("POST /orders HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                 "Content-Length: 2\r\n\r\n");
  CHECK(expecting.read_response().status == 100);
  expecting.send("{}");
  CHECK(expecting.read_response().status == 201);

  // Bytes that are not UTF-8 are recorded and reported unchanged.
  const std::string binary("\xff\xfe\x00\x80ok", 6);
  CHECK(it::HttpClient(backend.port()).post("/bin", binary).status == 201);
  CHECK(backend.wait_for_call([](const auto& c) { return c.target == "/bin"; }, "/bin").body ==
        binary);

  // An idle connection stays open: wait_closed times out and the connection still works.
  it::RawConnection idle(backend.port());
  CHECK_FALSE(idle.wait_closed(100ms));
  idle.send("GET /still-open HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(idle.read_response().status == 200);
  idle.shutdown_send();
  CHECK(idle.read_until_close(2s).empty());
}

TEST_CASE("parse_response: chunked, close-delimited, incomplete and malformed") {
  const auto chunked = it::parse_response(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nA: 1\r\na: 2\r\n\r\n"
      "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  CHECK(chunked.body == "abcde");
  CHECK(chunked.headers_named("A") == std::vector<std::string>{"1", "2"});
  CHECK(it::parse_response("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-eof").body ==
        "until-eof");
  CHECK_FALSE(it::try_parse_response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", false));
  CHECK_THROWS_AS(it::parse_response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"),
                  it::Failure);
  CHECK_THROWS_WITH_AS(it::parse_response("garbage\r\n\r\n"), doctest::Contains("malformed"),
                       it::Failure);
  const auto two = it::try_parse_response(
      "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false);
  REQUIRE(two);
  CHECK(two->first.status == 204);
  CHECK(two->second == std::string("HTTP/1.1 204 No Content\r\n\r\n").size());
}

TEST_CASE("Db: parameterized queries, NULLs, errors with SQLSTATE") {
  it::Db db(it::database_url());
  CHECK(db.scalar_int("SELECT $1::int + $2::int", {40, 2}) == 42);
  CHECK(db.scalar("SELECT $1::text", {std::nullopt}) == std::nullopt);
  CHECK(db.scalar("SELECT $1::text || $2", {"a'b", std::string("c")}) == "a'bc");
  CHECK(db.scalar("SELECT $1::boolean", {true}) == "t");

  db.exec("CREATE TEMP TABLE harness_probe (k text PRIMARY KEY, v bigint)");
  CHECK(db.exec("INSERT INTO harness_probe VALUES ($1, $2), ($3, NULL)", {"a", 1, "b"}) == 2);
  const auto rows = db.query("SELECT k, v FROM harness_probe ORDER BY k");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0] == it::Row{"a", "1"});
  CHECK(rows[1] == it::Row{"b", std::nullopt});
  CHECK_THROWS_WITH_AS(db.exec("INSERT INTO harness_probe VALUES ($1, 2)", {"a"}),
                       doctest::Contains("[23505]"), it::Failure);
  CHECK_THROWS_AS(db.scalar_int("SELECT k FROM harness_probe"), it::Failure);
  CHECK(db.connected());
}

TEST_CASE("sidecar_config: renders contract YAML that parses back as intended") {
  it::SidecarOptions options;
  options.port = 18080;
  options.upstream_url = "http://127.0.0.1:3000";
  options.database_url = "postgresql://u@127.0.0.1:5432/db?application_name=it";
  options.max_request_body = "1MiB";
  options.cleanup_batch = 10;
  it::RouteOptions second;
  second.name = "pay";
  second.path = "/tenants/{tid}/payments";
  second.scope = "POST /payments";
  second.fingerprint_fields = std::vector<std::string>{"/amount", "/items/*/sku"};
  second.fingerprint_defaults = {{"/currency", "\"EUR\""}, {"/qty", "1"}};
  second.mismatch_status = 422;
  second.max_stored_body = "65536";
  options.routes.push_back(second);

  const std::string yaml = it::sidecar_config(options);
  INFO(yaml);
  const YAML::Node root = YAML::Load(yaml);
  CHECK(root["listen"].as<std::string>() == "127.0.0.1:18080");
  CHECK(root["upstream"]["url"].as<std::string>() == options.upstream_url);
  CHECK(root["upstream"]["response_timeout"].as<std::string>() == "5s");
  CHECK(root["database"]["url"].as<std::string>() == options.database_url);
  CHECK(root["database"]["migrate"].as<std::string>() == "auto");
  CHECK(root["admin"]["listen"].as<std::string>().empty());
  CHECK(root["limits"]["max_request_body"].as<std::string>() == "1MiB");
  CHECK_FALSE(root["limits"]["max_header_bytes"]);  // unset: the sidecar's default
  CHECK(root["cleanup"]["batch"].as<int>() == 10);
  CHECK(root["log"]["level"].as<std::string>() == "info");

  const auto routes = root["routes"];
  REQUIRE(routes.size() == 2);
  CHECK(routes[0]["name"].as<std::string>() == "create-order");
  CHECK(routes[0]["lease"].as<std::string>() == "2s");
  CHECK(routes[0]["wait"].as<std::string>() == "300ms");
  CHECK(routes[0]["key"]["required"].as<bool>());
  CHECK_FALSE(routes[0]["fingerprint"]["fields"]);  // whole body
  CHECK(routes[0]["store"]["except"][2].as<int>() == 429);
  CHECK(routes[0]["replay_headers"][1].as<std::string>() == "Location");
  CHECK(routes[1]["path"].as<std::string>() == "/tenants/{tid}/payments");
  CHECK(routes[1]["scope"].as<std::string>() == "POST /payments");
  CHECK(routes[1]["fingerprint"]["fields"][1].as<std::string>() == "/items/*/sku");
  CHECK(routes[1]["fingerprint"]["defaults"]["/currency"].as<std::string>() == "EUR");
  CHECK(routes[1]["fingerprint"]["defaults"]["/qty"].as<int>() == 1);
  CHECK(routes[1]["mismatch_status"].as<int>() == 422);
  CHECK(routes[1]["max_stored_body"].as<int>() == 65536);

  it::SidecarOptions no_port;
  no_port.upstream_url = "http://127.0.0.1:1";
  no_port.database_url = "postgresql://x";
  CHECK_THROWS_AS(it::sidecar_config(no_port), it::Failure);
}

TEST_CASE("Sidecar: start, readiness, stop, restart and early exit (with a stand-in binary)") {
  // The real idemproxy is not needed to check the process handling: a script that takes
  // the same command line and serves the test backend on the configured port stands in.
  it::TempDir dir("idem-fake-sidecar");
  const auto fake = dir.write_file(
      "fake-idemproxy",
      "#!/bin/sh\n"
      "# usage: fake-idemproxy serve --config FILE\n"
      "[ \"$1\" = serve ] && [ \"$2\" = --config ] || exit 2\n"
      "port=$(sed -n 's/^listen: \"127.0.0.1:\\([0-9]*\\)\"$/\\1/p' \"$3\")\n"
      "exec " + it::test_backend_binary() + " --port \"$port\"\n");
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  it::TestBackend upstream;

  it::SidecarOptions options;
  options.upstream_url = upstream.url();
  options.database_url = "postgresql://unused";
  it::Sidecar sidecar(options, {.binary = fake.string()});
  CHECK(sidecar.port() != 0);
  CHECK(sidecar.config().find("127.0.0.1:" + std::to_string(sidecar.port())) !=
        std::string::npos);
  it::HttpClient client(sidecar.port());
  CHECK(client.post("/orders", "{}").status == 201);

  CHECK(sidecar.stop().success());  // the stand-in exits 0 on SIGTERM
  CHECK_FALSE(sidecar.running());
  sidecar.restart();
  CHECK(client.post("/orders", "{}").status == 201);
  sidecar.kill9();
  CHECK(sidecar.process().exit_status()->signal() == SIGKILL);

  const auto broken = dir.write_file("broken-idemproxy",
                                     "#!/bin/sh\necho 'config.yaml:3: unknown key' >&2\nexit 2\n");
  std::filesystem::permissions(broken, std::filesystem::perms::owner_all);
  CHECK_THROWS_WITH_AS(it::Sidecar(options, {.binary = broken.string()}),
                       doctest::Contains("unknown key"), it::Failure);
}

}  // TEST_SUITE
