// The admin handler against the in-memory store: routing, authorization, path decoding,
// what a record lookup shows (and never shows), purges, store failures and deadlines.
// No sockets: requests go straight to Handler::handle on a local event loop.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "admin/admin.hpp"
#include "common/time_text.hpp"
#include "idempotency/fingerprint.hpp"
#include "store/memory_store.hpp"
#include "test_support/problem.hpp"

namespace {

using namespace idem;
using admin::detail::percent_decode;
using admin::detail::parse_record_path;
using std::chrono::system_clock;

const asio::ip::address kLoopback = asio::ip::make_address("127.0.0.1");
const asio::ip::address kRemote = asio::ip::make_address("10.1.2.3");

// A store whose calls never finish on their own (a database that stopped answering): only
// cancellation ends them.
class HangingStore final : public store::Store {
 public:
  template <class T>
  static asio::awaitable<result<T>> hang() {
    asio::steady_timer forever(co_await asio::this_coro::executor, std::chrono::hours(1));
    co_await forever.async_wait(asio::use_awaitable);  // throws when cancelled
    co_return result<T>(boost::system::in_place_error, make_error_code(errc::store_protocol));
  }
  asio::awaitable<result<store::ClaimResult>> claim(const store::ClaimRequest&) override {
    return hang<store::ClaimResult>();
  }
  asio::awaitable<result<std::optional<store::Record>>> read(const store::RecordId&) override {
    return hang<std::optional<store::Record>>();
  }
  asio::awaitable<result<std::optional<store::Ownership>>> take_over(const store::RecordId&,
                                                                     std::int64_t, Millis) override {
    return hang<std::optional<store::Ownership>>();
  }
  asio::awaitable<result<std::optional<store::Ownership>>> replace_expired(
      const store::ClaimRequest&, std::int64_t) override {
    return hang<std::optional<store::Ownership>>();
  }
  asio::awaitable<result<store::Completed>> complete(const store::RecordId&, std::int64_t,
                                                      const store::StoredResponse&, Millis) override {
    return hang<store::Completed>();
  }
  asio::awaitable<result<bool>> release(const store::RecordId&, std::int64_t) override {
    return hang<bool>();
  }
  asio::awaitable<result<bool>> renew(const store::RecordId&, std::int64_t, Millis) override {
    return hang<bool>();
  }
  asio::awaitable<result<bool>> expire_lease(const store::RecordId&, std::int64_t) override {
    return hang<bool>();
  }
  asio::awaitable<result<bool>> purge(const store::RecordId&) override { return hang<bool>(); }
  asio::awaitable<result<store::PayloadSeen>> note_payload(const store::PayloadNote&) override {
    co_return store::PayloadSeen{};
  }
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t) override {
    return hang<std::size_t>();
  }
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override {
    return hang<std::optional<Millis>>();
  }
  asio::awaitable<result<bool>> register_operation(const store::RecordId&,
                                                   std::string_view) override {
    return hang<bool>();
  }
  asio::awaitable<result<std::optional<store::OperationRecord>>> find_operation(
      std::string_view, std::string_view) override {
    return hang<std::optional<store::OperationRecord>>();
  }
};

struct Fixture {
  Fixture() {
    spdlog::set_level(spdlog::level::off);
    rebuild();
  }

  void rebuild(store::Store* s = nullptr) {
    admin::Dependencies deps;
    deps.store = s ? s : &memory;
    deps.metrics = &metrics;
    deps.token = [this] { return token; };
    deps.store_deadline = std::chrono::milliseconds(100);
    if (probe) deps.readiness = [this]() -> asio::awaitable<admin::Readiness> { co_return *probe; };
    handler = std::make_unique<admin::Handler>(std::move(deps));
  }

  server::Response call(http::verb method, std::string target, asio::ip::address peer = kLoopback,
                        std::optional<std::string> authorization = std::nullopt) {
    server::Request req{method, target, 11};
    if (authorization) req.set(http::field::authorization, *authorization);
    server::RequestContext ctx{{peer, 40000}, SteadyClock::now(), 1};
    server::Response out;
    asio::co_spawn(ioc, [&]() -> asio::awaitable<void> { out = co_await handler->handle(req, ctx); },
                   asio::detached);
    ioc.restart();
    ioc.run();
    return out;
  }

  template <class F>
  void run(F f) {
    asio::co_spawn(ioc, f, asio::detached);
    ioc.restart();
    ioc.run();
  }

  // A completed record whose body and header values must never show in admin answers.
  void seed_completed(const store::RecordId& id) {
    run([&]() -> asio::awaitable<void> {
      const store::ClaimRequest claim{id, std::string(64, 'f'), "", Millis{30000}, Millis{3600000}};
      auto won = co_await memory.claim(claim);
      REQUIRE(won.has_value());
      REQUIRE(won->won);
      store::StoredResponse resp;
      resp.status = 201;
      resp.headers = {{"Content-Type", "application/json"}, {"Location", "/orders/SECRET-LOCATION"}};
      resp.body = R"({"card":"SECRET-BODY"})";
      auto done = co_await memory.complete(id, won->owner.fence, resp, Millis{3600000});
      REQUIRE(done.has_value());
      CHECK(*done == store::Completion::recorded);
    });
  }

  asio::io_context ioc;
  system_clock::time_point now = system_clock::from_time_t(1'700'000'000);
  store::MemoryStore memory{[this] { return now; }};
  obs::Metrics metrics;
  std::string token;
  std::optional<admin::Readiness> probe;
  std::unique_ptr<admin::Handler> handler;
};

boost::json::object body_json(const server::Response& res) {
  return boost::json::parse(res.body()).as_object();
}

using test::problem_code;

}  // namespace

TEST_CASE("healthz, readyz, metrics and unknown paths") {
  Fixture f;
  auto health = f.call(http::verb::get, "/healthz");
  CHECK(health.result() == http::status::ok);
  CHECK(body_json(health).at("status") == "alive");
  CHECK(health[http::field::cache_control] == "no-store");

  auto post = f.call(http::verb::post, "/healthz");
  CHECK(post.result() == http::status::method_not_allowed);
  CHECK(post[http::field::allow] == "GET, HEAD");

  CHECK(f.call(http::verb::get, "/nothing").result() == http::status::not_found);
  CHECK(f.call(http::verb::get, "/healthz/").result() == http::status::not_found);
  // The query string is not part of the path.
  CHECK(f.call(http::verb::get, "/healthz?verbose=1").result() == http::status::ok);

  SUBCASE("readiness follows the probe") {
    f.probe = admin::Readiness{true, "ready", ""};
    f.rebuild();
    CHECK(f.call(http::verb::get, "/readyz").result() == http::status::ok);
    f.probe = admin::Readiness{false, "schema_behind", "pending migrations: 2"};
    f.rebuild();
    auto res = f.call(http::verb::get, "/readyz");
    CHECK(res.result() == http::status::service_unavailable);
    CHECK(body_json(res).at("reason") == "schema_behind");
    CHECK(body_json(res).at("detail") == "pending migrations: 2");
  }
  SUBCASE("draining makes it unready whatever the store says") {
    f.probe = admin::Readiness{true, "ready", ""};
    f.rebuild();
    f.handler->set_draining();
    auto res = f.call(http::verb::get, "/readyz");
    CHECK(res.result() == http::status::service_unavailable);
    CHECK(body_json(res).at("reason") == "draining");
    CHECK(f.call(http::verb::get, "/healthz").result() == http::status::ok);
  }
  SUBCASE("metrics: Prometheus text with the gauge sampled from the store") {
    f.run([&]() -> asio::awaitable<void> {
      const store::ClaimRequest claim{{"t", "POST /orders", "k"}, "fp", "", Millis{30000},
                                      Millis{3600000}};
      auto won = co_await f.memory.claim(claim);
      CHECK(won->won);
    });
    f.now += std::chrono::seconds(42);
    auto res = f.call(http::verb::get, "/metrics");
    CHECK(res.result() == http::status::ok);
    CHECK(res[http::field::content_type] == "text/plain; version=0.0.4; charset=utf-8");
    CHECK(res.body().find("# TYPE idemproxy_requests_total counter") != std::string::npos);
    CHECK(res.body().find("\nidemproxy_in_progress_oldest_seconds 42\n") != std::string::npos);
  }
}

TEST_CASE("/admin/ without a token: loopback clients only") {
  Fixture f;
  const std::string path = "/admin/records/t/POST%20%2Forders/k";
  CHECK(f.call(http::verb::get, path, kLoopback).result() == http::status::not_found);
  CHECK(f.call(http::verb::get, path, asio::ip::make_address("::1")).result() ==
        http::status::not_found);
  CHECK(f.call(http::verb::get, path, asio::ip::make_address("::ffff:127.0.0.1")).result() ==
        http::status::not_found);
  auto refused = f.call(http::verb::get, path, kRemote);
  CHECK(refused.result() == http::status::forbidden);
  CHECK(problem_code(refused) == "admin_forbidden");
  CHECK(f.call(http::verb::get, path, asio::ip::make_address("::ffff:10.0.0.1")).result() ==
        http::status::forbidden);
  // The probes and metrics stay open to everyone.
  CHECK(f.call(http::verb::get, "/metrics", kRemote).result() == http::status::ok);
  CHECK(f.call(http::verb::get, "/healthz", kRemote).result() == http::status::ok);
}

TEST_CASE("/admin/ with a token: the bearer token, from anywhere, and nothing else") {
  Fixture f;
  f.token = "s3cret-token";
  const std::string path = "/admin/records/t/POST%20%2Forders/k";

  auto none = f.call(http::verb::get, path, kLoopback);
  CHECK(none.result() == http::status::unauthorized);
  CHECK(problem_code(none) == "admin_unauthorized");
  CHECK(none[http::field::www_authenticate] == "Bearer realm=\"idemproxy-admin\"");
  CHECK(f.call(http::verb::get, path, kLoopback, "Bearer wrong").result() == http::status::unauthorized);
  CHECK(f.call(http::verb::get, path, kLoopback, "Bearer s3cret-token-and-more").result() ==
        http::status::unauthorized);
  CHECK(f.call(http::verb::get, path, kLoopback, "Basic s3cret-token").result() ==
        http::status::unauthorized);
  CHECK(f.call(http::verb::get, path, kLoopback, "Bearer").result() == http::status::unauthorized);
  // Unknown admin paths are refused before they are routed: no map of the API for free.
  CHECK(f.call(http::verb::get, "/admin/secret-things", kRemote).result() ==
        http::status::unauthorized);

  CHECK(f.call(http::verb::get, path, kRemote, "Bearer s3cret-token").result() ==
        http::status::not_found);
  CHECK(f.call(http::verb::get, path, kRemote, "bearer   s3cret-token ").result() ==
        http::status::not_found);
  CHECK(f.call(http::verb::get, "/admin/secret-things", kRemote, "Bearer s3cret-token").result() ==
        http::status::not_found);

  SUBCASE("the token is read per request: a reload rotates it") {
    f.token = "rotated";
    CHECK(f.call(http::verb::get, path, kRemote, "Bearer s3cret-token").result() ==
          http::status::unauthorized);
    CHECK(f.call(http::verb::get, path, kRemote, "Bearer rotated").result() ==
          http::status::not_found);
  }
}

TEST_CASE("record paths are three percent-decoded segments") {
  CHECK(percent_decode("abc") == "abc");
  CHECK(percent_decode("POST%20%2Forders") == "POST /orders");
  CHECK(percent_decode("a%2fb%3F%25") == "a/b?%");
  CHECK(percent_decode("a+b") == "a+b");
  CHECK(percent_decode("%") == std::nullopt);
  CHECK(percent_decode("%4") == std::nullopt);
  CHECK(percent_decode("ab%4") == std::nullopt);
  CHECK(percent_decode("%zz") == std::nullopt);
  CHECK(percent_decode("%00") == std::nullopt);
  CHECK(percent_decode("%41%42") == "AB");

  const auto p = parse_record_path("acme/POST%20%2Forders/order%2F1%3Fx");
  REQUIRE(p);
  CHECK(p->tenant == "acme");
  CHECK(p->scope == "POST /orders");
  CHECK(p->key == "order/1?x");
  CHECK_FALSE(parse_record_path("acme/POST%20%2Forders"));
  CHECK_FALSE(parse_record_path("acme/POST%20%2Forders/k/extra"));
  CHECK_FALSE(parse_record_path("acme/POST%20%2Forders/k/"));
  CHECK_FALSE(parse_record_path("acme//k"));
  CHECK_FALSE(parse_record_path("/acme/s/k"));
  CHECK_FALSE(parse_record_path("acme/s/%zz"));
  CHECK_FALSE(parse_record_path(""));
}

TEST_CASE("token comparison and bearer parsing") {
  using admin::detail::bearer_token;
  using admin::detail::token_equals;
  CHECK(token_equals("abc", "abc"));
  CHECK_FALSE(token_equals("abc", "abd"));
  CHECK_FALSE(token_equals("abc", "abcd"));
  CHECK_FALSE(token_equals("", "abc"));
  CHECK(bearer_token("Bearer abc") == "abc");
  CHECK(bearer_token("BEARER abc") == "abc");
  CHECK(bearer_token("  Bearer   abc  ") == "abc");
  CHECK(bearer_token("Bearerabc") == std::nullopt);
  CHECK(bearer_token("Bearer ") == std::nullopt);
  CHECK(bearer_token("Token abc") == std::nullopt);
}

TEST_CASE("timestamps are RFC 3339 UTC with microseconds") {
  using idem::rfc3339_from_us;
  CHECK(rfc3339_from_us(0) == "1970-01-01T00:00:00.000000Z");
  CHECK(rfc3339_from_us(1'700'000'000'123'456) == "2023-11-14T22:13:20.123456Z");
  CHECK(rfc3339_from_us(-1) == "1969-12-31T23:59:59.999999Z");
}

TEST_CASE("a record lookup shows state and timing, never the body or header values") {
  Fixture f;
  const store::RecordId id{"acme", "POST /orders", "order/1?x"};
  f.seed_completed(id);
  const std::string path = "/admin/records/acme/POST%20%2Forders/order%2F1%3Fx";

  auto res = f.call(http::verb::get, path);
  REQUIRE(res.result() == http::status::ok);
  CHECK(res[http::field::content_type] == "application/json");
  CHECK(res.body().find("SECRET-BODY") == std::string::npos);
  CHECK(res.body().find("SECRET-LOCATION") == std::string::npos);
  CHECK(res.body().find("application/json") == std::string::npos);  // a header's value
  const auto o = body_json(res);
  CHECK(o.at("tenant") == "acme");
  CHECK(o.at("scope") == "POST /orders");
  CHECK(o.at("key") == "order/1?x");
  CHECK(std::string(o.at("key_hash").as_string()) == idempotency::log_hash("acme", "order/1?x"));
  CHECK(o.at("state") == "completed");
  CHECK(o.at("attempt") == 1);
  CHECK(o.at("fencing_token").as_int64() > 0);
  CHECK(o.at("created_at") == "2023-11-14T22:13:20.000000Z");
  CHECK(o.at("completed_at") == "2023-11-14T22:13:20.000000Z");
  CHECK(o.at("expires_at") == "2023-11-14T23:13:20.000000Z");
  CHECK(o.at("lease_expires_at").is_null());
  CHECK(o.at("expired") == false);
  CHECK(std::string(o.at("fingerprint_prefix").as_string()) == std::string(16, 'f'));
  CHECK(o.at("response_status") == 201);
  CHECK(o.at("response_body_bytes") == 22);
  CHECK(o.at("response_body_omitted") == false);
  CHECK(o.at("replay_header_names") == boost::json::array{"Content-Type", "Location"});

  // The same record under another scope or tenant does not exist: nothing by key alone.
  CHECK(f.call(http::verb::get, "/admin/records/other/POST%20%2Forders/order%2F1%3Fx").result() ==
        http::status::not_found);
  CHECK(f.call(http::verb::get, "/admin/records/acme/POST%20%2Fpayments/order%2F1%3Fx").result() ==
        http::status::not_found);
  // The raw '/' would make four segments.
  CHECK(f.call(http::verb::get, "/admin/records/acme/POST /orders/order%2F1%3Fx").result() ==
        http::status::bad_request);
  auto bad = f.call(http::verb::get, "/admin/records/acme/POST%20%2Forders/%zz");
  CHECK(bad.result() == http::status::bad_request);
  CHECK(problem_code(bad) == "admin_bad_path");
  CHECK(f.call(http::verb::put, path).result() == http::status::method_not_allowed);
}

TEST_CASE("an in-progress record shows its lease") {
  Fixture f;
  f.run([&]() -> asio::awaitable<void> {
    const store::ClaimRequest claim{{"t", "s", "k"}, "abc", "p", Millis{30000}, Millis{3600000}};
    CHECK((co_await f.memory.claim(claim))->won);
  });
  const auto o = body_json(f.call(http::verb::get, "/admin/records/t/s/k"));
  CHECK(o.at("state") == "in_progress");
  CHECK(o.at("lease_expires_at") == "2023-11-14T22:13:50.000000Z");
  CHECK(o.at("lease_expired") == false);
  CHECK(o.at("completed_at").is_null());
  CHECK(o.at("response_status").is_null());
  CHECK(o.at("principal_bound") == true);
  CHECK(o.at("fingerprint_prefix") == "abc");
}

TEST_CASE("DELETE purges one record; 404 when there is none") {
  Fixture f;
  const store::RecordId id{"acme", "POST /orders", "k1"};
  f.seed_completed(id);
  f.seed_completed({"acme", "POST /orders", "k2"});
  const std::string path = "/admin/records/acme/POST%20%2Forders/k1";
  auto gone = f.call(http::verb::delete_, path);
  CHECK(gone.result() == http::status::no_content);
  CHECK(gone.body().empty());
  CHECK(f.memory.size() == 1);
  CHECK(f.call(http::verb::get, path).result() == http::status::not_found);
  auto again = f.call(http::verb::delete_, path);
  CHECK(again.result() == http::status::not_found);
  CHECK(problem_code(again) == "record_not_found");
  CHECK(f.memory.size() == 1);
}

TEST_CASE("store failures and deadlines answer 503 and are counted") {
  Fixture f;
  f.memory.set_unavailable(true);
  auto res = f.call(http::verb::get, "/admin/records/t/s/k");
  CHECK(res.result() == http::status::service_unavailable);
  CHECK(problem_code(res) == "idempotency_store_unavailable");
  CHECK(f.call(http::verb::delete_, "/admin/records/t/s/k").result() ==
        http::status::service_unavailable);
  // A scrape still answers, with the gauge's last value.
  auto scrape = f.call(http::verb::get, "/metrics");
  CHECK(scrape.result() == http::status::ok);
  CHECK(scrape.body().find("idemproxy_store_errors_total{kind=\"unavailable\"} 3") !=
        std::string::npos);

  HangingStore hanging;
  f.rebuild(&hanging);
  const auto t0 = SteadyClock::now();
  CHECK(f.call(http::verb::get, "/admin/records/t/s/k").result() == http::status::service_unavailable);
  CHECK(f.call(http::verb::get, "/metrics").result() == http::status::ok);
  CHECK(SteadyClock::now() - t0 < std::chrono::seconds(5));
  CHECK(f.metrics.render_prometheus().find("idemproxy_store_errors_total{kind=\"timeout\"} 2") !=
        std::string::npos);
}
