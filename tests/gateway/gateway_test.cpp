// The gateway's protocol against the in-memory store and a scripted upstream: every
// branch of contract §4 checked by the store's rows and the upstream's calls, fast and
// without sockets. The same flows run against PostgreSQL and a real backend in
// integration/.
#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <optional>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "common/time_text.hpp"
#include "gateway/caching_store.hpp"
#include "gateway/examine.hpp"
#include "gateway/gateway.hpp"
#include "idempotency/backend_completion.hpp"
#include "idempotency/fingerprint.hpp"
#include "store/memory_store.hpp"
#include "test_support/problem.hpp"

namespace {

using namespace idem;
using std::chrono::system_clock;

// A backend stand-in: records every forwarded request and answers from a script.
class ScriptedUpstream final : public upstream::Client {
 public:
  using Script = std::function<asio::awaitable<upstream::Outcome>(const upstream::Request&, int seq)>;

  explicit ScriptedUpstream(asio::any_io_executor ex) : gate(ex) {
    gate.expires_at(SteadyClock::time_point::max());
  }

  asio::awaitable<upstream::Outcome> send(upstream::Request request) override {
    calls.push_back(request);
    const int seq = static_cast<int>(calls.size());
    if (!scripts.empty()) {
      auto script = std::move(scripts.front());
      scripts.pop_front();
      // The local copy, not calls.back(): later calls may reallocate the vector.
      co_return co_await script(request, seq);
    }
    co_return created(seq, request);
  }

  static upstream::Outcome created(int seq, const upstream::Request& req, int status = 201) {
    upstream::Outcome out;
    out.response.result(static_cast<http::status>(status));
    out.response.version(11);
    out.response.set(http::field::content_type, "application/json");
    out.response.set(http::field::location, "/orders/ord-" + std::to_string(seq));
    out.response.set("X-Backend-Seq", std::to_string(seq));
    std::string attempt(req["X-Idempotency-Attempt"]);
    out.response.body() = "{\"order_id\":\"ord-" + std::to_string(seq) + "\",\"attempt\":\"" + attempt + "\"}";
    out.response.prepare_payload();
    return out;
  }

  // Holds the next answer until open_gate() is called.
  void hold_next() {
    scripts.push_back([this](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      error_code ec;
      co_await gate.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      co_return created(seq, req);
    });
  }
  void open_gate() { gate.cancel(); }

  // Holds the next answer until the returned gate is cancelled; `status` is the answer.
  std::shared_ptr<asio::steady_timer> hold_next_on_own_gate(int status = 201) {
    auto own = std::make_shared<asio::steady_timer>(gate.get_executor());
    own->expires_at(SteadyClock::time_point::max());
    scripts.push_back([own, status](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      error_code ec;
      co_await own->async_wait(asio::redirect_error(asio::use_awaitable, ec));
      co_return created(seq, req, status);
    });
    return own;
  }

  void fail_next(upstream::Failure f) {
    scripts.push_back([f](const upstream::Request&, int) -> asio::awaitable<upstream::Outcome> {
      upstream::Outcome out;
      out.failure = f;
      co_return out;
    });
  }

  void answer_next(int status, std::string body = "{}") {
    scripts.push_back([status, body](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      auto out = created(seq, req, status);
      out.response.body() = body;
      out.response.prepare_payload();
      co_return out;
    });
  }

  std::vector<upstream::Request> calls;
  std::deque<Script> scripts;
  asio::steady_timer gate;
};

// A decorator over the in-memory store with two knobs:
//   * read_along: a lost claim comes with the row already read, as PgStore hands it over
//     when it sends the claim and the read in one round trip; the gateway must decide on
//     it exactly as on its own read();
//   * commit_then_fail_completes: the next N completions are written and then reported
//     as timed out, as when a statement commits but its answer never arrives.
class ProbeStore final : public store::Store {
 public:
  explicit ProbeStore(store::Store& inner) : inner_(inner) {}

  asio::awaitable<result<store::ClaimResult>> claim(const store::ClaimRequest& req) override {
    ++claims;
    auto claimed = co_await inner_.claim(req);
    if (!read_along || !claimed || claimed->won) co_return claimed;
    auto row = co_await inner_.read(req.id);
    if (!row) co_return row.error();
    claimed->row_read = true;
    claimed->row = std::move(*row);
    ++rows_handed_over;
    co_return claimed;
  }
  asio::awaitable<result<std::optional<store::Record>>> read(const store::RecordId& id) override {
    ++reads;
    return inner_.read(id);
  }
  asio::awaitable<result<std::optional<store::Ownership>>> take_over(const store::RecordId& id,
                                                                     std::int64_t seen,
                                                                     Millis lease) override {
    return inner_.take_over(id, seen, lease);
  }
  asio::awaitable<result<std::optional<store::Ownership>>> replace_expired(
      const store::ClaimRequest& req, std::int64_t seen) override {
    return inner_.replace_expired(req, seen);
  }
  asio::awaitable<result<store::Completed>> complete(const store::RecordId& id, std::int64_t fence,
                                                      const store::StoredResponse& response,
                                                      Millis retention) override {
    ++completes;
    auto written = co_await inner_.complete(id, fence, response, retention);
    if (commit_then_fail_completes > 0 && written) {
      --commit_then_fail_completes;
      co_return make_error_code(errc::store_timeout);
    }
    co_return written;
  }
  asio::awaitable<result<bool>> release(const store::RecordId& id, std::int64_t fence) override {
    return inner_.release(id, fence);
  }
  asio::awaitable<result<bool>> renew(const store::RecordId& id, std::int64_t fence,
                                      Millis lease) override {
    return inner_.renew(id, fence, lease);
  }
  asio::awaitable<result<bool>> expire_lease(const store::RecordId& id, std::int64_t fence) override {
    return inner_.expire_lease(id, fence);
  }
  asio::awaitable<result<bool>> purge(const store::RecordId& id) override { return inner_.purge(id); }
  asio::awaitable<result<store::PayloadSeen>> note_payload(const store::PayloadNote& note) override {
    ++notes;
    if (fail_notes) return fail_note();
    return inner_.note_payload(note);
  }
  static asio::awaitable<result<store::PayloadSeen>> fail_note() {
    co_return make_error_code(errc::store_timeout);
  }
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) override {
    return inner_.delete_expired(batch);
  }
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override {
    return inner_.oldest_in_progress_age();
  }
  asio::awaitable<result<bool>> register_operation(const store::RecordId& id,
                                                   std::string_view op) override {
    return inner_.register_operation(id, op);
  }
  asio::awaitable<result<std::optional<store::OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view op) override {
    ++finds;
    return inner_.find_operation(tenant, op);
  }

  bool read_along = false;
  int commit_then_fail_completes = 0;
  int claims = 0;
  int rows_handed_over = 0;  // lost claims that came with their row
  int reads = 0;             // separate read() calls
  int completes = 0;
  int finds = 0;
  int notes = 0;            // note_payload calls
  bool fail_notes = false;  // note_payload answers a store timeout

 private:
  store::Store& inner_;
};

const std::string kBody = R"({"customer_id":"c1","amount":1000,"currency":"EUR"})";

struct Fixture {
  explicit Fixture(bool read_along = false)
      : probe(store), caching(probe, cache), upstream(ioc.get_executor()) {
    probe.read_along = read_along;
    spdlog::set_level(spdlog::level::off);
    settings::Settings s;
    s.upstream.host = "127.0.0.1";
    s.upstream.port = 1;
    settings::RouteSettings r;
    r.name = "create-order";
    r.method = "POST";
    r.path = "/orders";
    r.scope = "POST /orders";
    r.fingerprint.fields = std::vector<std::string>{"/customer_id", "/amount", "/currency"};
    r.fingerprint.defaults["/currency"] = "\"EUR\"";
    r.lease = Millis{30000};
    r.wait = Millis{50};
    r.retention = Millis{3600 * 1000};
    r.max_stored_body = 1024;
    s.routes.push_back(r);
    configure(std::move(s));
  }

  void configure(settings::Settings s) {
    auto rt = gateway::Runtime::build(
        std::shared_ptr<const settings::Settings>(std::make_shared<settings::Settings>(std::move(s))));
    if (!holder) {
      holder = std::make_shared<gateway::RuntimeHolder>(rt);
    } else {
      holder->store(rt);
    }
    gateway::Dependencies deps;
    deps.executor = ioc.get_executor();
    deps.runtime = holder;
    deps.store = &caching;
    deps.upstream = &upstream;
    deps.waiters = &waiters;
    deps.metrics = &metrics;
    gw = std::make_unique<gateway::Gateway>(std::move(deps));
  }

  // A reload as the sidecar does it: the same gateway sees the next snapshot.
  void reload(settings::Settings s) {
    holder->store(gateway::Runtime::build(
        std::shared_ptr<const settings::Settings>(std::make_shared<settings::Settings>(std::move(s)))));
  }

  settings::RouteSettings& route() {
    return const_cast<settings::RouteSettings&>(holder->load()->settings().routes.front());
  }

  static server::Request order(std::string_view key, std::string body,
                               std::string_view tenant = "t1") {
    server::Request req{http::verb::post, "/orders", 11};
    req.set(http::field::host, "sidecar");
    if (!tenant.empty()) req.set("X-Tenant-Id", tenant);
    if (!key.empty()) req.set("Idempotency-Key", key);
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

  asio::awaitable<server::Response> handle(server::Request req) {
    server::RequestContext ctx;
    ctx.peer = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 40000);
    ctx.received_at = SteadyClock::now();
    co_return co_await gw->handle(req, ctx);
  }

  server::Response call(server::Request req) {
    std::optional<server::Response> out;
    asio::co_spawn(ioc, [&]() -> asio::awaitable<void> { out = co_await handle(std::move(req)); },
                   [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
    ioc.restart();
    ioc.run();
    REQUIRE(out.has_value());
    return std::move(*out);
  }

  // Runs an owner held in the upstream and a duplicate of it; once the duplicate waits
  // (registered with the waiter registry), the upstream answers. Returns both answers and
  // how many waiters were registered at that moment.
  struct OwnerAndDuplicate {
    std::optional<server::Response> owner, dup;
    std::size_t waiting_seen = 0;
  };
  OwnerAndDuplicate owner_and_waiting_duplicate() {
    OwnerAndDuplicate out;
    asio::co_spawn(ioc, [&]() -> asio::awaitable<void> {
      asio::co_spawn(ioc, [&]() -> asio::awaitable<void> { out.owner = co_await handle(order("k1", kBody)); }, asio::detached);
      asio::co_spawn(ioc, [&]() -> asio::awaitable<void> { out.dup = co_await handle(order("k1", kBody)); }, asio::detached);
      // Let both run until they block: the owner in the upstream, the duplicate in its wait.
      asio::steady_timer t(ioc);
      const std::string key = std::string("t1") + '\0' + "POST /orders" + '\0' + "k1";
      for (int i = 0; i < 1000 && waiters.waiting(key) == 0; ++i) {
        t.expires_after(Millis{1});
        co_await t.async_wait(asio::use_awaitable);
      }
      out.waiting_seen = waiters.waiting(key);
      upstream.open_gate();
    }, asio::detached);
    ioc.restart();
    ioc.run();
    return out;
  }

  std::optional<store::Record> row(std::string_view key, std::string_view tenant = "t1") {
    std::optional<store::Record> out;
    asio::co_spawn(ioc, [&]() -> asio::awaitable<void> {
      // A named id: GCC 12 double-destroys braced temporaries inside co_await expressions.
      const store::RecordId id{std::string(tenant), "POST /orders", std::string(key)};
      auto r = co_await store.read(id);
      REQUIRE(r.has_value());
      out = *r;
    }, asio::detached);
    ioc.restart();
    ioc.run();
    return out;
  }

  system_clock::time_point now = system_clock::now();
  asio::io_context ioc;
  store::MemoryStore store{[this] { return now; }};
  obs::Metrics metrics;
  // Inactive (never listening) unless a test says so: the other cases test the store path.
  gateway::ReplayCache cache{&metrics};
  ProbeStore probe;
  gateway::CachingStore caching;
  ScriptedUpstream upstream;
  gateway::WaiterRegistry waiters;
  std::shared_ptr<gateway::RuntimeHolder> holder;
  std::unique_ptr<gateway::Gateway> gw;
};

using test::problem_code;


}  // namespace

TEST_CASE("first request is forwarded with operation id and attempt, then replayed") {
  Fixture f;
  auto first = f.call(Fixture::order("k1", kBody));
  CHECK(first.result_int() == 201);
  CHECK(first["Idempotent-Replayed"].empty());
  CHECK(first["X-Backend-Seq"] == "1");
  REQUIRE(f.upstream.calls.size() == 1);
  const auto& sent = f.upstream.calls.front();
  CHECK(sent["X-Idempotency-Attempt"] == "1");
  CHECK(sent["X-Idempotency-Operation-Id"] == idempotency::operation_id("t1", "POST /orders", "k1"));
  CHECK(sent["Idempotency-Key"] == "k1");
  CHECK(sent["X-Forwarded-For"] == "127.0.0.1");

  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(row->attempt == 1);
  REQUIRE(row->response);
  CHECK(row->response->status == 201);
  CHECK(row->response->resource_id == "/orders/ord-1");

  // Same operation, different formatting, field order and number form: a replay.
  auto again = f.call(Fixture::order("\"k1\"", R"({ "currency":"EUR", "amount": 1e3, "customer_id":"c1" })"));
  CHECK(f.upstream.calls.size() == 1);
  CHECK(again.result_int() == 201);
  CHECK(again.body() == first.body());
  CHECK(again["Location"] == first["Location"]);
  CHECK(again["Content-Type"] == "application/json");
  CHECK(again["Idempotent-Replayed"] == "true");
  CHECK(again["X-Backend-Seq"].empty());  // not in replay_headers
  CHECK(f.metrics.requests("create-order", obs::Outcome::created) == 1);
  CHECK(f.metrics.requests("create-order", obs::Outcome::replayed) == 1);
}

TEST_CASE("an omitted field with a default and an unselected field keep the fingerprint") {
  Fixture f;
  f.call(Fixture::order("k1", kBody));
  auto res = f.call(Fixture::order("k1", R"({"customer_id":"c1","amount":1000.0,"note":"x"})"));
  CHECK(res["Idempotent-Replayed"] == "true");
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("same key with a different amount is refused and changes nothing") {
  Fixture f;
  f.call(Fixture::order("k1", kBody));
  const auto before = f.row("k1");
  auto res = f.call(Fixture::order("k1", R"({"customer_id":"c1","amount":1001,"currency":"EUR"})"));
  CHECK(res.result_int() == 409);
  CHECK(problem_code(res) == "idempotency_key_reused");
  CHECK(res[http::field::content_type] == "application/problem+json");
  CHECK(f.upstream.calls.size() == 1);
  const auto after = f.row("k1");
  REQUIRE(after);
  CHECK(after->fingerprint == before->fingerprint);
  CHECK(after->attempt == before->attempt);
  CHECK(after->response->body == before->response->body);

  f.route().mismatch_status = 422;
  auto res422 = f.call(Fixture::order("k1", R"({"customer_id":"c2","amount":1000})"));
  CHECK(res422.result_int() == 422);
  CHECK(f.metrics.requests("create-order", obs::Outcome::key_reused) == 2);
}

TEST_CASE("tenants are isolated: same key, two operations") {
  Fixture f;
  auto a = f.call(Fixture::order("k1", kBody, "tenant-a"));
  auto b = f.call(Fixture::order("k1", kBody, "tenant-b"));
  CHECK(a.result_int() == 201);
  CHECK(b.result_int() == 201);
  CHECK(b["Idempotent-Replayed"].empty());
  REQUIRE(f.upstream.calls.size() == 2);
  CHECK(f.upstream.calls[0]["X-Idempotency-Operation-Id"] !=
        f.upstream.calls[1]["X-Idempotency-Operation-Id"]);
  CHECK(f.store.size() == 2);
}

TEST_CASE("validation failures answer the contract's codes and claim nothing") {
  Fixture f;
  struct Case {
    server::Request req;
    int status;
    std::string code;
  };
  std::vector<Case> cases;
  cases.push_back({Fixture::order("k1", kBody, ""), 401, "tenant_missing"});
  cases.push_back({Fixture::order("", kBody), 400, "idempotency_key_missing"});
  cases.push_back({Fixture::order("has space\"", kBody), 400, "idempotency_key_invalid"});
  cases.push_back({Fixture::order(std::string(256, 'k'), kBody), 400, "idempotency_key_invalid"});
  cases.push_back({Fixture::order("k1", "{not json"), 400, "invalid_json"});
  auto text = Fixture::order("k1", "hello");
  text.set(http::field::content_type, "text/plain");
  cases.push_back({std::move(text), 415, "unsupported_media_type"});
  auto two_keys = Fixture::order("k1", kBody);
  two_keys.insert("Idempotency-Key", "k2");
  cases.push_back({std::move(two_keys), 400, "idempotency_key_invalid"});
  auto two_tenants = Fixture::order("k1", kBody);
  two_tenants.insert("X-Tenant-Id", "t2");
  cases.push_back({std::move(two_tenants), 401, "tenant_missing"});

  for (auto& c : cases) {
    auto res = f.call(std::move(c.req));
    CHECK(res.result_int() == c.status);
    CHECK(problem_code(res) == c.code);
  }
  CHECK(f.store.size() == 0);
  CHECK(f.upstream.calls.empty());
  CHECK(f.metrics.requests("create-order", obs::Outcome::rejected) == cases.size());
}

TEST_CASE("a key-less request on a non-required route passes through unprotected") {
  Fixture f;
  f.route().key.required = false;
  auto res = f.call(Fixture::order("", kBody));
  CHECK(res.result_int() == 201);
  CHECK(f.store.size() == 0);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0]["X-Idempotency-Attempt"].empty());
}

TEST_CASE("client-supplied operation id, attempt and fencing token headers never reach the backend") {
  Fixture f;
  auto req = Fixture::order("k1", kBody);
  req.set("X-Idempotency-Operation-Id", "forged");
  req.set("X-Idempotency-Attempt", "99");
  req.set("X-Idempotency-Fencing-Token", "99");
  f.call(std::move(req));
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0]["X-Idempotency-Attempt"] == "1");
  CHECK(f.upstream.calls[0]["X-Idempotency-Operation-Id"] != "forged");
  CHECK(f.upstream.calls[0]["X-Idempotency-Fencing-Token"] == std::to_string(f.row("k1")->fence));

  server::Request other{http::verb::get, "/health", 11};
  other.set("X-Idempotency-Attempt", "99");
  other.set("X-Idempotency-Fencing-Token", "99");
  f.call(std::move(other));
  REQUIRE(f.upstream.calls.size() == 2);
  CHECK(f.upstream.calls[1].find("X-Idempotency-Attempt") == f.upstream.calls[1].end());
  CHECK(f.upstream.calls[1].find("X-Idempotency-Fencing-Token") == f.upstream.calls[1].end());
}

TEST_CASE("upstream 5xx releases the claim; a retry reaches the backend; 422 is stored") {
  Fixture f;
  f.upstream.answer_next(503, R"({"error":"busy"})");
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(res.result_int() == 503);
  CHECK(res.body() == R"({"error":"busy"})");
  CHECK(f.store.size() == 0);
  auto retry = f.call(Fixture::order("k1", kBody));
  CHECK(retry.result_int() == 201);
  CHECK(f.upstream.calls.size() == 2);
  CHECK(f.upstream.calls[1]["X-Idempotency-Attempt"] == "1");

  f.upstream.answer_next(422, R"({"error":"coupon expired"})");
  auto rejected = f.call(Fixture::order("k2", kBody));
  CHECK(rejected.result_int() == 422);
  auto replayed = f.call(Fixture::order("k2", kBody));
  CHECK(replayed.result_int() == 422);
  CHECK(replayed.body() == R"({"error":"coupon expired"})");
  CHECK(replayed["Idempotent-Replayed"] == "true");
  CHECK(f.upstream.calls.size() == 3);

  f.upstream.answer_next(429);
  f.call(Fixture::order("k3", kBody));
  CHECK_FALSE(f.row("k3").has_value());
  CHECK(f.metrics.requests("create-order", obs::Outcome::released) == 2);
}

TEST_CASE("refused connection releases with 502; timeout expires the lease and a retry takes over") {
  Fixture f;
  f.upstream.fail_next(upstream::Failure::connect_failed);
  auto refused = f.call(Fixture::order("k1", kBody));
  CHECK(refused.result_int() == 502);
  CHECK(problem_code(refused) == "upstream_unavailable");
  CHECK_FALSE(f.row("k1").has_value());

  f.upstream.fail_next(upstream::Failure::timeout);
  auto timed_out = f.call(Fixture::order("k2", kBody));
  CHECK(timed_out.result_int() == 504);
  CHECK(problem_code(timed_out) == "upstream_timeout");
  auto row = f.row("k2");
  REQUIRE(row);
  CHECK(row->state == store::State::in_progress);
  CHECK(row->lease_expired);

  auto retry = f.call(Fixture::order("k2", kBody));
  CHECK(retry.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 3);
  CHECK(f.upstream.calls[2]["X-Idempotency-Attempt"] == "2");
  CHECK(f.upstream.calls[2]["X-Idempotency-Operation-Id"] ==
        f.upstream.calls[1]["X-Idempotency-Operation-Id"]);
  CHECK(f.metrics.takeovers() == 1);
  auto replay = f.call(Fixture::order("k2", kBody));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == retry.body());
}

TEST_CASE("store unavailable fails closed with 503 and Retry-After, nothing forwarded") {
  Fixture f;
  f.store.set_unavailable(true);
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(res.result_int() == 503);
  CHECK(problem_code(res) == "idempotency_store_unavailable");
  CHECK(res[http::field::retry_after] == "1");
  CHECK(f.upstream.calls.empty());
  f.store.set_unavailable(false);
  CHECK(f.call(Fixture::order("k1", kBody)).result_int() == 201);
}

TEST_CASE("a duplicate waits for an in-process owner and is woken by its completion") {
  Fixture f;
  f.route().wait = Millis{10000};
  f.upstream.hold_next();
  auto [owner, dup, waiting_seen] = f.owner_and_waiting_duplicate();
  CHECK(waiting_seen == 1);
  REQUIRE(owner);
  REQUIRE(dup);
  CHECK(owner->result_int() == 201);
  CHECK(dup->result_int() == 201);
  CHECK((*dup)["Idempotent-Replayed"] == "true");
  CHECK(dup->body() == owner->body());
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("a duplicate past `wait` gets 409 in progress with Retry-After, then a replay") {
  Fixture f;
  f.route().wait = Millis{30};
  f.route().retry_after = Millis{2500};
  f.upstream.hold_next();
  std::optional<server::Response> owner, dup;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { owner = co_await f.handle(Fixture::order("k1", kBody)); }, asio::detached);
    dup = co_await f.handle(Fixture::order("k1", kBody));
    f.upstream.open_gate();
  }, asio::detached);
  f.ioc.run();
  REQUIRE(dup);
  CHECK(dup->result_int() == 409);
  CHECK(problem_code(*dup) == "idempotency_in_progress");
  CHECK((*dup)[http::field::retry_after] == "3");
  REQUIRE(owner);
  CHECK(owner->result_int() == 201);
  auto later = f.call(Fixture::order("k1", kBody));
  CHECK(later["Idempotent-Replayed"] == "true");
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.metrics.requests("create-order", obs::Outcome::in_progress) == 1);
}

TEST_CASE("an expired record is replaced and the key starts a new operation") {
  Fixture f;
  f.call(Fixture::order("k1", kBody));
  f.now += std::chrono::hours(2);  // past retention (1h)
  auto res = f.call(Fixture::order("k1", R"({"customer_id":"c9","amount":5})"));
  CHECK(res.result_int() == 201);
  CHECK(res["Idempotent-Replayed"].empty());
  REQUIRE(f.upstream.calls.size() == 2);
  CHECK(f.upstream.calls[1]["X-Idempotency-Attempt"] == "2");
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(row->response->body == res.body());
}

TEST_CASE("a stale owner's completion is fenced after a takeover") {
  Fixture f;
  f.route().lease = Millis{1000};
  f.upstream.hold_next();
  std::optional<server::Response> stale, fresh;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { stale = co_await f.handle(Fixture::order("k1", kBody)); }, asio::detached);
    asio::steady_timer t(f.ioc);
    while (f.upstream.calls.empty()) {
      t.expires_after(Millis{1});
      co_await t.async_wait(asio::use_awaitable);
    }
    f.now += std::chrono::seconds(5);  // the owner looks dead: its lease lapsed
    fresh = co_await f.handle(Fixture::order("k1", kBody));
    f.upstream.open_gate();
  }, asio::detached);
  f.ioc.run();
  REQUIRE(fresh);
  REQUIRE(stale);
  CHECK(fresh->result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 2);
  CHECK(f.upstream.calls[1]["X-Idempotency-Attempt"] == "2");
  CHECK(f.upstream.calls[1]["X-Idempotency-Fencing-Token"] !=
        f.upstream.calls[0]["X-Idempotency-Fencing-Token"]);
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->attempt == 2);
  CHECK(row->response->body == fresh->body());
  CHECK(f.metrics.fenced_writes() == 1);
  // The stale owner's client gets what the record holds, never the unrecorded answer.
  CHECK(stale->result_int() == 201);
  CHECK(stale->body() == fresh->body());
  CHECK(stale->at("Idempotent-Replayed") == "true");
  CHECK(f.metrics.fenced_answers("replayed") == 1);
}

// The defect per-row tokens had: a release deletes the row, the next claim of the key starts
// again at attempt 1, and the owner of the released claim, resumed, matched it. Here that
// stale owner gets a 503 from the backend and releases: with per-row tokens it deleted the
// new claim, whose completion then found no row, and its client saw 201 for an operation
// PostgreSQL held no record of.
TEST_CASE("a stale owner of a released claim cannot touch the key's next claim") {
  Fixture f;
  f.route().lease = Millis{1000};
  auto stale_gate = f.upstream.hold_next_on_own_gate(503);  // the stale owner's call
  f.upstream.answer_next(503);                               // the takeover's call
  auto next_gate = f.upstream.hold_next_on_own_gate(201);    // the next claim's call
  std::optional<server::Response> stale, taken, next;
  std::optional<store::Record> while_next_runs;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    asio::steady_timer t(f.ioc);
    auto until_calls = [&](std::size_t n) -> asio::awaitable<void> {
      while (f.upstream.calls.size() < n) {
        t.expires_after(Millis{1});
        co_await t.async_wait(asio::use_awaitable);
      }
    };
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { stale = co_await f.handle(Fixture::order("k1", kBody)); }, asio::detached);
    co_await until_calls(1);
    f.now += std::chrono::seconds(5);  // the owner looks dead: its lease lapsed
    taken = co_await f.handle(Fixture::order("k1", kBody));  // takes over, 503, releases
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { next = co_await f.handle(Fixture::order("k1", kBody)); }, asio::detached);
    co_await until_calls(3);
    stale_gate->cancel();  // the stale owner resumes with its 503 and releases... nothing
    while (!stale) {
      t.expires_after(Millis{1});
      co_await t.async_wait(asio::use_awaitable);
    }
    const store::RecordId id{"t1", "POST /orders", "k1"};
    while_next_runs = (co_await f.store.read(id)).value();
    next_gate->cancel();
  }, asio::detached);
  f.ioc.run();
  REQUIRE(stale);
  REQUIRE(taken);
  REQUIRE(next);
  REQUIRE(f.upstream.calls.size() == 3);
  const auto& calls = f.upstream.calls;
  CHECK(calls[0]["X-Idempotency-Attempt"] == "1");
  CHECK(calls[1]["X-Idempotency-Attempt"] == "2");
  CHECK(calls[2]["X-Idempotency-Attempt"] == "1");  // a fresh claim after the release
  CHECK(calls[2]["X-Idempotency-Fencing-Token"] != calls[0]["X-Idempotency-Fencing-Token"]);
  CHECK(taken->result_int() == 503);

  // The stale release changed nothing: the next claim still ran, under its own token.
  REQUIRE(while_next_runs);
  CHECK(while_next_runs->state == store::State::in_progress);
  CHECK(std::to_string(while_next_runs->fence) == std::string(calls[2]["X-Idempotency-Fencing-Token"]));
  // Its client was told to retry, not given the backend's answer to a stale attempt.
  CHECK(stale->result_int() == 409);
  CHECK(problem_code(*stale) == "idempotency_in_progress");

  // The next claim completed, and the record holds exactly what its client saw.
  CHECK(next->result_int() == 201);
  const auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  REQUIRE(row->response);
  CHECK(row->response->body == next->body());
  CHECK(f.metrics.fenced_writes() == 1);
  CHECK(f.metrics.fenced_answers("in_progress") == 1);
}

TEST_CASE("a completion retried after a lost answer that finds its own record is a success") {
  Fixture f;
  f.probe.commit_then_fail_completes = 1;  // committed, but the answer never arrived
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(f.probe.completes == 2);
  CHECK(res.result_int() == 201);
  CHECK(res["Idempotent-Replayed"].empty());
  const auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(row->response->body == res.body());
  CHECK(f.metrics.fenced_writes() == 0);  // nothing was fenced
  CHECK(f.metrics.requests("create-order", obs::Outcome::created) == 1);
}

TEST_CASE("a fenced owner whose key is free again answers 503 to retry, never its own answer") {
  Fixture f;
  f.route().lease = Millis{1000};
  auto stale_gate = f.upstream.hold_next_on_own_gate(201);
  f.upstream.answer_next(503);  // the takeover's call: released, the key is free
  std::optional<server::Response> stale, taken;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    asio::steady_timer t(f.ioc);
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { stale = co_await f.handle(Fixture::order("k1", kBody)); }, asio::detached);
    while (f.upstream.calls.empty()) {
      t.expires_after(Millis{1});
      co_await t.async_wait(asio::use_awaitable);
    }
    f.now += std::chrono::seconds(5);
    taken = co_await f.handle(Fixture::order("k1", kBody));
    stale_gate->cancel();
  }, asio::detached);
  f.ioc.run();
  REQUIRE(stale);
  REQUIRE(taken);
  CHECK(taken->result_int() == 503);
  CHECK(stale->result_int() == 503);
  CHECK(problem_code(*stale) == "idempotency_store_unavailable");
  CHECK_FALSE(stale->at(http::field::retry_after).empty());
  CHECK(f.store.size() == 0);  // the stale owner did not claim or write anything
  CHECK(f.metrics.fenced_answers("unavailable") == 1);
  // The retry it was told to make runs as a new claim and is recorded.
  auto retry = f.call(Fixture::order("k1", kBody));
  CHECK(retry.result_int() == 201);
  CHECK(f.row("k1")->state == store::State::completed);
}

TEST_CASE("another principal's key is forbidden") {
  Fixture f;
  auto s = std::make_shared<settings::Settings>(f.holder->load()->settings());
  s->tenant.principal_header = "X-User-Id";
  f.configure(*s);
  auto req = Fixture::order("k1", kBody);
  req.set("X-User-Id", "alice");
  CHECK(f.call(std::move(req)).result_int() == 201);
  auto bob = Fixture::order("k1", kBody);
  bob.set("X-User-Id", "bob");
  auto res = f.call(std::move(bob));
  CHECK(res.result_int() == 403);
  CHECK(problem_code(res) == "idempotency_key_forbidden");
  auto alice = Fixture::order("k1", kBody);
  alice.set("X-User-Id", "alice");
  CHECK(f.call(std::move(alice))["Idempotent-Replayed"] == "true");
}

TEST_CASE("a response larger than max_stored_body is passed on and replayed without body") {
  Fixture f;
  f.upstream.answer_next(201, std::string(4096, 'x'));
  auto first = f.call(Fixture::order("k1", kBody));
  CHECK(first.body().size() == 4096);
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay.result_int() == 201);
  CHECK(replay["Idempotent-Replay-Body"] == "omitted");
  CHECK(replay.body().empty());
}

TEST_CASE("unmatched routes pass through, or are refused with 404 when configured") {
  Fixture f;
  server::Request get{http::verb::get, "/orders/ord-1", 11};
  auto res = f.call(std::move(get));
  CHECK(res.result_int() == 201);  // the scripted upstream answers everything with 201
  CHECK(f.store.size() == 0);
  CHECK(f.metrics.requests("unmatched", obs::Outcome::passthrough) == 1);

  auto s = f.holder->load()->settings();
  s.unmatched = settings::Unmatched::reject;
  f.configure(s);
  server::Request other{http::verb::get, "/other", 11};
  auto refused = f.call(std::move(other));
  CHECK(refused.result_int() == 404);
  CHECK(problem_code(refused) == "route_not_found");
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("a templated route fingerprints the concrete path: a key reused on another resource is refused") {
  Fixture f;
  auto s = f.holder->load()->settings();
  s.routes.front().path = "/accounts/{account}/orders";
  s.routes.front().scope = "POST /accounts/{account}/orders";
  f.configure(s);
  auto on = [](std::string target) {
    auto req = Fixture::order("k1", kBody);
    req.target(target);
    return req;
  };
  CHECK(f.call(on("/accounts/1/orders")).result_int() == 201);
  CHECK(f.call(on("/accounts/1/orders"))["Idempotent-Replayed"] == "true");
  auto other = f.call(on("/accounts/2/orders"));
  CHECK(other.result_int() == 409);
  CHECK(problem_code(other) == "idempotency_key_reused");
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("a key-less request on an optional route passes through even without a tenant") {
  Fixture f;
  f.route().key.required = false;
  auto res = f.call(Fixture::order("", kBody, ""));
  CHECK(res.result_int() == 201);
  CHECK(f.store.size() == 0);
  CHECK(f.metrics.requests("create-order", obs::Outcome::passthrough) == 1);
}

TEST_CASE("a lost claim that brings its row along is decided exactly like a read") {
  SUBCASE("replay and mismatch, without a separate read") {
    Fixture f(true);
    auto first = f.call(Fixture::order("k1", kBody));
    CHECK(first.result_int() == 201);
    auto again = f.call(Fixture::order("k1", kBody));
    CHECK(again["Idempotent-Replayed"] == "true");
    CHECK(again.body() == first.body());
    auto reused = f.call(Fixture::order("k1", R"({"customer_id":"c1","amount":7})"));
    CHECK(problem_code(reused) == "idempotency_key_reused");
    CHECK(f.upstream.calls.size() == 1);
    CHECK(f.probe.rows_handed_over == 2);
    CHECK(f.probe.reads == 0);  // the row came with the claim both times
  }

  SUBCASE("an in-progress row read with the claim is read again once the waiter is registered") {
    Fixture f(true);
    f.route().wait = Millis{10000};
    f.upstream.hold_next();
    auto [owner, dup, waiting_seen] = f.owner_and_waiting_duplicate();
    CHECK(waiting_seen == 1);
    REQUIRE(owner);
    REQUIRE(dup);
    CHECK(owner->result_int() == 201);
    CHECK((*dup)["Idempotent-Replayed"] == "true");
    CHECK(dup->body() == owner->body());
    CHECK(f.upstream.calls.size() == 1);
    CHECK(f.probe.rows_handed_over == 1);
    // The handed-over row said "in progress": not trusted for a wait, read again after
    // the waiter's registration, then once more after the wake-up.
    CHECK(f.probe.reads >= 2);
  }

  SUBCASE("an expired record is replaced, an expired lease taken over") {
    Fixture f(true);
    f.call(Fixture::order("k1", kBody));
    f.now += std::chrono::hours(2);  // past retention (1h)
    auto replaced = f.call(Fixture::order("k1", R"({"customer_id":"c9","amount":5})"));
    CHECK(replaced.result_int() == 201);
    CHECK(replaced["Idempotent-Replayed"].empty());
    REQUIRE(f.upstream.calls.size() == 2);
    CHECK(f.upstream.calls[1]["X-Idempotency-Attempt"] == "2");

    f.route().lease = Millis{1000};
    f.upstream.fail_next(upstream::Failure::timeout);  // outcome unknown: lease ends now
    CHECK(f.call(Fixture::order("k2", kBody)).result_int() == 504);
    auto retried = f.call(Fixture::order("k2", kBody));
    CHECK(retried.result_int() == 201);
    REQUIRE(f.upstream.calls.size() == 4);
    CHECK(f.upstream.calls[3]["X-Idempotency-Attempt"] == "2");
    CHECK(f.probe.rows_handed_over == 2);
  }
}

TEST_CASE("with the replay cache: a replayed record answers retries from memory, exactly as the store would") {
  Fixture f(true);
  f.cache.set_listening(true);
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 201);
  // The owner's own answer is not cached: only records that are actually retried are.
  CHECK(f.cache.entries() == 0);

  auto from_store = f.call(Fixture::order("k1", kBody));
  CHECK(from_store["Idempotent-Replayed"] == "true");
  CHECK(f.probe.claims == 2);
  CHECK(f.cache.entries() == 1);

  auto from_memory = f.call(Fixture::order("\"k1\"", R"({"amount":1e3,"customer_id":"c1"})"));
  CHECK(f.probe.claims == 2);  // no store call at all
  CHECK(f.metrics.replay_cache_hits() == 1);
  CHECK(from_memory.result_int() == from_store.result_int());
  CHECK(from_memory.body() == from_store.body());
  CHECK(from_memory["Location"] == from_store["Location"]);
  CHECK(from_memory["Content-Type"] == from_store["Content-Type"]);
  CHECK(from_memory["Idempotent-Replayed"] == "true");
  CHECK(f.metrics.requests("create-order", obs::Outcome::replayed) == 2);

  // A different request under the key: refused from memory too, nothing forwarded.
  auto reused = f.call(Fixture::order("k1", R"({"customer_id":"c1","amount":7})"));
  CHECK(reused.result_int() == 409);
  CHECK(problem_code(reused) == "idempotency_key_reused");
  CHECK(f.probe.claims == 2);

  // Another tenant's same key is its own record: a miss, a new operation.
  auto other = f.call(Fixture::order("k1", kBody, "t2"));
  CHECK(other.result_int() == 201);
  CHECK(other["Idempotent-Replayed"].empty());
  CHECK(f.upstream.calls.size() == 2);
  CHECK(f.probe.claims == 3);
}

TEST_CASE("with the replay cache: an announced change sends the next request to the store") {
  Fixture f(true);
  f.cache.set_listening(true);
  f.call(Fixture::order("k1", kBody));
  f.call(Fixture::order("k1", kBody));  // read from the store, kept
  REQUIRE(f.cache.entries() == 1);

  // A purge elsewhere: the row goes, and PostgreSQL announces the operation id.
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    const store::RecordId id{"t1", "POST /orders", "k1"};
    auto purged = co_await f.store.purge(id);
    REQUIRE(purged);
  }, asio::detached);
  f.ioc.restart();
  f.ioc.run();
  f.cache.evict(idempotency::operation_id("t1", "POST /orders", "k1"));

  auto fresh = f.call(Fixture::order("k1", kBody));
  CHECK(fresh.result_int() == 201);
  CHECK(fresh["Idempotent-Replayed"].empty());
  CHECK(f.upstream.calls.size() == 2);
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->response->body == fresh.body());
}

TEST_CASE("with the replay cache inactive (not listening), every retry reads the store") {
  Fixture f(true);
  f.call(Fixture::order("k1", kBody));
  for (int i = 0; i < 3; ++i) {
    CHECK(f.call(Fixture::order("k1", kBody))["Idempotent-Replayed"] == "true");
  }
  CHECK(f.probe.claims == 4);
  CHECK(f.cache.entries() == 0);
  CHECK(f.metrics.replay_cache_hits() == 0);
}

TEST_CASE("with the replay cache: another principal is refused from memory too") {
  Fixture f(true);
  auto s = std::make_shared<settings::Settings>(f.holder->load()->settings());
  s->tenant.principal_header = "X-User-Id";
  f.configure(*s);
  f.cache.set_listening(true);
  auto as = [](std::string_view user) {
    auto req = Fixture::order("k1", kBody);
    req.set("X-User-Id", user);
    return req;
  };
  REQUIRE(f.call(as("alice")).result_int() == 201);
  REQUIRE(f.call(as("alice"))["Idempotent-Replayed"] == "true");  // read, kept
  const int claims = f.probe.claims;
  auto bob = f.call(as("bob"));
  CHECK(bob.result_int() == 403);
  CHECK(problem_code(bob) == "idempotency_key_forbidden");
  CHECK(f.call(as("alice"))["Idempotent-Replayed"] == "true");
  CHECK(f.probe.claims == claims);  // both decided on the cached record
  CHECK(f.metrics.replay_cache_hits() == 2);
}

// ---------------------------------------------------------------------------------------
// Request hardening (issue 10): what the gateway decides by is what the backend receives.

TEST_CASE("look-alikes of the tenant and trusted headers never reach the backend") {
  Fixture f;
  auto req = Fixture::order("k1", kBody);
  req.insert("X_Tenant_Id", "victim");
  req.insert("X_Idempotency_Operation_Id", "forged");
  req.insert("X_Idempotency_Attempt", "99");
  req.insert("Idempotency_Key", "other");
  CHECK(f.call(std::move(req)).result_int() == 201);
  server::Request other{http::verb::get, "/health", 11};
  other.insert("X_Idempotency_Attempt", "99");
  other.insert("X_Tenant_Id", "victim");
  f.call(std::move(other));
  REQUIRE(f.upstream.calls.size() == 2);
  for (const auto& sent : f.upstream.calls) {
    for (const auto& field : sent) CHECK(std::string(field.name_string()).find('_') == std::string::npos);
  }
  CHECK(f.upstream.calls[0]["X-Tenant-Id"] == "t1");
  CHECK(f.upstream.calls[0]["X-Idempotency-Attempt"] == "1");
}

TEST_CASE("Connection naming a decided header is refused before anything is claimed") {
  Fixture f;
  for (const char* option : {"X-Tenant-Id", "Idempotency-Key", "Host", "Content-Type"}) {
    CAPTURE(option);
    auto req = Fixture::order("k1", kBody);
    req.set(http::field::connection, std::string("keep-alive, ") + option);
    auto res = f.call(std::move(req));
    CHECK(res.result_int() == 400);
    CHECK(problem_code(res) == "bad_request");
  }
  server::Request other{http::verb::get, "/health", 11};
  other.set("X-Tenant-Id", "t1");
  other.set(http::field::connection, "X-Tenant-Id");
  CHECK(f.call(std::move(other)).result_int() == 400);
  CHECK(f.upstream.calls.empty());
  CHECK(f.store.size() == 0);
}

TEST_CASE("a repeated principal header is refused") {
  Fixture f;
  auto s = std::make_shared<settings::Settings>(f.holder->load()->settings());
  s->tenant.principal_header = "X-User-Id";
  f.configure(*s);
  auto req = Fixture::order("k1", kBody);
  req.insert("X-User-Id", "alice");
  req.insert("X-User-Id", "bob");
  auto res = f.call(std::move(req));
  CHECK(res.result_int() == 401);
  CHECK(problem_code(res) == "principal_invalid");
  CHECK(f.upstream.calls.empty());
  CHECK(f.store.size() == 0);
}

TEST_CASE("a target that resembles a route is refused, not passed through unprotected") {
  Fixture f;
  for (const char* target : {"//orders", "/orders/", "/Orders", "/orders;x=1"}) {
    CAPTURE(target);
    auto req = Fixture::order("k1", kBody);
    req.target(target);
    auto res = f.call(std::move(req));
    CHECK(res.result_int() == 400);
    CHECK(problem_code(res) == "bad_request");
  }
  auto lower = Fixture::order("k1", kBody);
  lower.method_string("post");
  CHECK(f.call(std::move(lower)).result_int() == 400);
  CHECK(f.upstream.calls.empty());
  CHECK(f.store.size() == 0);
  server::Request get{http::verb::get, "/orders/", 11};
  CHECK(f.call(std::move(get)).result_int() == 201);  // another method: not the route
}

TEST_CASE("a backend's own replay markers are stripped from the first answer and not recorded") {
  Fixture f;
  f.route().replay_headers.push_back("Idempotent-Replayed");
  f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    auto out = ScriptedUpstream::created(seq, req);
    out.response.set("Idempotent-Replayed", "true");
    out.response.set("Idempotent-Replay-Body", "omitted");
    co_return out;
  });
  auto first = f.call(Fixture::order("k1", kBody));
  CHECK(first.result_int() == 201);
  CHECK(first.count("Idempotent-Replayed") == 0);
  CHECK(first.count("Idempotent-Replay-Body") == 0);
  auto row = f.row("k1");
  REQUIRE(row);
  REQUIRE(row->response);
  for (const auto& h : row->response->headers) CHECK(h.name.find("Idempotent") == std::string::npos);
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay.count("Idempotent-Replayed") == 1);
  CHECK(replay.count("Idempotent-Replay-Body") == 0);
  CHECK_FALSE(replay.body().empty());
}

TEST_CASE("a Location that is not UTF-8 is recorded exactly; the resource id is text") {
  Fixture f;
  const std::string location = "/orders/\xff\xfe-\x80";
  f.upstream.scripts.push_back([location](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    auto out = ScriptedUpstream::created(seq, req);
    out.response.set(http::field::location, location);
    co_return out;
  });
  auto first = f.call(Fixture::order("k1", kBody));
  CHECK(first.result_int() == 201);
  CHECK(first[http::field::location] == location);
  auto row = f.row("k1");
  REQUIRE(row);
  REQUIRE(row->response);
  CHECK(row->response->resource_id == "/orders/%FF%FE-%80");
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay[http::field::location] == location);
}

// ---- completion: backend ---------------------------------------------------------------------

namespace {

// The fencing token of an X-Idempotency-Record reference (v1.<fence>.<ms>.<scope>.<key>).
std::int64_t fence_of_reference(std::string_view ref) {
  const auto a = ref.find('.');
  const auto b = ref.find('.', a + 1);
  return std::stoll(std::string(ref.substr(a + 1, b - a - 1)));
}

// A backend that completes the record in its own "transaction" (here: the in-memory store,
// under the fence its reference names) and says so with the digest of what it recorded.
// `recorded_body`: what it records; the response carries `sent_body`.
upstream::Outcome backend_recording(Fixture& f, const upstream::Request& req, int seq,
                                    std::string recorded_body, std::string sent_body,
                                    bool say_recorded = true) {
  auto out = ScriptedUpstream::created(seq, req);
  out.response.body() = sent_body;
  out.response.prepare_payload();
  store::StoredResponse rec;
  rec.status = 201;
  rec.headers = {{"Content-Type", "application/json"}};
  rec.body = recorded_body;
  rec.resource_id = "/orders/ord-" + std::to_string(seq);
  const store::RecordId id{std::string(req["X-Tenant-Id"]), "POST /orders",
                           std::string(req["Idempotency-Key"])};
  const auto fence = fence_of_reference(req["X-Idempotency-Record"]);
  std::optional<store::Completion> done;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    done = (co_await f.store.complete(id, fence, rec, Millis{3600000})).value().outcome;
  }, asio::detached);
  // The store answers without suspending: the completion has run by now.
  REQUIRE(done == store::Completion::recorded);
  if (say_recorded) {
    out.response.set("X-Idempotency-Recorded",
                      idempotency::answer_digest(201, rec.resource_id, recorded_body));
  }
  return out;
}

}  // namespace

TEST_CASE("completion: backend — a record the backend confirms costs the sidecar no write") {
  Fixture f;
  f.route().completion = settings::Completion::backend;
  f.upstream.scripts.push_back([&](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    co_return backend_recording(f, req, seq, "{\"order\":1}", "{\"order\":1}");
  });
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(res.result_int() == 201);
  CHECK(res.body() == "{\"order\":1}");
  CHECK(res["X-Idempotency-Recorded"].empty());  // the backend's control field stays here
  CHECK(f.probe.completes == 0);
  const auto& sent = f.upstream.calls.front();
  const auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(sent["X-Idempotency-Record"] ==
        idempotency::record_reference(row->fence, f.route().retention, "POST /orders", "k1"));
  CHECK(sent["X-Idempotency-Record-Created"] == rfc3339_from_us(row->created_at_us));
  CHECK_FALSE(sent["X-Idempotency-Record-Expires"].empty());
  CHECK(f.metrics.backend_completions("confirmed") == 1);
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == "{\"order\":1}");
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("completion: backend — a backend that recorded another answer is counted; the record wins") {
  Fixture f;
  f.route().completion = settings::Completion::backend;
  f.upstream.scripts.push_back([&](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    co_return backend_recording(f, req, seq, "{\"order\":\"recorded\"}", "{\"order\":\"sent\"}");
  });
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(res.result_int() == 201);
  CHECK(res.body() == "{\"order\":\"recorded\"}");  // what every retry will get
  CHECK(res["Idempotent-Replayed"].empty());
  CHECK(f.probe.completes == 0);
  CHECK(f.metrics.backend_completions("differed") == 1);
  CHECK(f.metrics.requests("create-order", obs::Outcome::created) == 1);
  CHECK(f.call(Fixture::order("k1", kBody)).body() == res.body());
}

TEST_CASE("completion: backend — a backend that did not record leaves it to the sidecar") {
  Fixture f;
  f.route().completion = settings::Completion::backend;
  auto res = f.call(Fixture::order("k1", kBody));  // the scripted default records nothing
  CHECK(res.result_int() == 201);
  CHECK(f.probe.completes == 1);
  CHECK(f.row("k1")->state == store::State::completed);
  CHECK(f.metrics.backend_completions("absent") == 1);
}

TEST_CASE("completion: sidecar — no record reference is forwarded, and the sidecar writes") {
  Fixture f;
  f.call(Fixture::order("k1", kBody));
  const auto& sent = f.upstream.calls.front();
  CHECK(sent.find("X-Idempotency-Record") == sent.end());
  CHECK_FALSE(sent["X-Idempotency-Record-Created"].empty());  // the lifetime goes everywhere
  CHECK(f.probe.completes == 1);
  CHECK(f.metrics.backend_completions("absent") == 0);
}

TEST_CASE("a backend directive releases or records one answer against the route's lists") {
  Fixture f;
  SUBCASE("release: a 201 that must not be remembered (e.g. validation)") {
    f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      auto out = ScriptedUpstream::created(seq, req, 201);
      out.response.set("X-Idempotency-Directive", "release");
      co_return out;
    });
    auto res = f.call(Fixture::order("k1", kBody));
    CHECK(res.result_int() == 201);
    CHECK(res["X-Idempotency-Directive"].empty());
    CHECK_FALSE(f.row("k1").has_value());  // released
    CHECK(f.metrics.directives("release") == 1);
    CHECK(f.metrics.requests("create-order", obs::Outcome::released) == 1);
  }
  SUBCASE("record: a 503 that is a deterministic rejection") {
    f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      auto out = ScriptedUpstream::created(seq, req, 503);
      out.response.set("X-Idempotency-Directive", "Record");
      co_return out;
    });
    auto res = f.call(Fixture::order("k1", kBody));
    CHECK(res.result_int() == 503);
    const auto row = f.row("k1");
    REQUIRE(row);
    CHECK(row->state == store::State::completed);
    CHECK(row->response->status == 503);
    REQUIRE(f.call(Fixture::order("k1", kBody))["Idempotent-Replayed"] == "true");
    CHECK(f.metrics.directives("record") == 1);
  }
  SUBCASE("anything else is ignored, counted, and the route's lists decide") {
    f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
      auto out = ScriptedUpstream::created(seq, req, 201);
      out.response.set("X-Idempotency-Directive", "forget-it");
      co_return out;
    });
    f.call(Fixture::order("k1", kBody));
    CHECK(f.row("k1")->state == store::State::completed);
    CHECK(f.metrics.directives("invalid") == 1);
  }
}

// ---- Long operations: key expiry, re-fetch replays, reconciliation --------------------------

TEST_CASE("the key's expiry is advertised from the record: first answer, replay, in progress") {
  Fixture f;
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 201);
  auto row = f.row("k1");
  REQUIRE(row);
  const std::string expires = imf_fixdate_from_us(row->expires_at_us);
  CHECK(first["Idempotency-Key-Expires"] == expires);
  auto again = f.call(Fixture::order("k1", kBody));
  CHECK(again["Idempotent-Replayed"] == "true");
  CHECK(again["Idempotency-Key-Expires"] == expires);
  // A backend's own value never reaches the client.
  f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    auto out = ScriptedUpstream::created(seq, req);
    out.response.set("Idempotency-Key-Expires", "Thu, 01 Jan 2099 00:00:00 GMT");
    co_return out;
  });
  auto other = f.call(Fixture::order("k2", kBody));
  CHECK(other["Idempotency-Key-Expires"] == imf_fixdate_from_us(f.row("k2")->expires_at_us));
  // A mismatch is about another request's key: nothing about its lifetime goes out.
  auto reused = f.call(Fixture::order("k1", R"({"customer_id":"c2","amount":1})"));
  CHECK(reused.result_int() == 409);
  CHECK(reused["Idempotency-Key-Expires"].empty());
}

TEST_CASE("the key's expiry: a duplicate that gives up waiting is told the running record's") {
  Fixture f;
  auto gate = f.upstream.hold_next_on_own_gate();
  std::optional<server::Response> owner, dup;
  std::int64_t running_expiry = 0;
  asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> { owner = co_await f.handle(Fixture::order("k9", kBody)); }, asio::detached);
    asio::co_spawn(f.ioc, [&]() -> asio::awaitable<void> {
      dup = co_await f.handle(Fixture::order("k9", kBody));
      const store::RecordId id{"t1", "POST /orders", "k9"};
      auto r = co_await f.store.read(id);
      if (r && *r) running_expiry = (*r)->expires_at_us;
      gate->cancel();  // only now may the owner complete
    }, asio::detached);
    co_return;
  }, asio::detached);
  f.ioc.restart();
  f.ioc.run();
  REQUIRE(dup);
  REQUIRE(dup->result_int() == 409);
  REQUIRE(running_expiry > 0);
  CHECK((*dup)["Idempotency-Key-Expires"] == imf_fixdate_from_us(running_expiry));
  REQUIRE(owner);
  CHECK((*owner)["Idempotency-Key-Expires"] == imf_fixdate_from_us(f.row("k9")->expires_at_us));
}

namespace {

server::Request with_credentials(server::Request req, std::string_view auth) {
  req.set(http::field::authorization, auth);
  return req;
}

void answer_with(ScriptedUpstream& up, int status, std::string body, std::string etag = {}) {
  up.scripts.push_back([status, body, etag](const upstream::Request&, int) -> asio::awaitable<upstream::Outcome> {
    upstream::Outcome out;
    out.response.result(static_cast<http::status>(status));
    out.response.version(11);
    out.response.set(http::field::content_type, "application/json");
    if (!etag.empty()) out.response.set(http::field::etag, etag);
    out.response.body() = body;
    out.response.prepare_payload();
    co_return out;
  });
}

}  // namespace

TEST_CASE("refetch: a replay GETs the resource as the retrying client and answers the first status") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  auto first = f.call(with_credentials(Fixture::order("k1", kBody), "Bearer alice"));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);

  answer_with(f.upstream, 200, R"({"order_id":"ord-1","status":"shipped"})", "\"v2\"");
  auto replay = f.call(with_credentials(Fixture::order("k1", kBody), "Bearer alice-renewed"));
  REQUIRE(f.upstream.calls.size() == 2);
  const auto& fetch = f.upstream.calls[1];
  CHECK(fetch.method() == http::verb::get);
  CHECK(fetch.target() == "/orders/ord-1");
  CHECK(fetch[http::field::authorization] == "Bearer alice-renewed");
  CHECK(fetch["X-Tenant-Id"] == "t1");
  CHECK(fetch.body().empty());
  CHECK(fetch[http::field::content_type].empty());
  CHECK(fetch["Idempotency-Key"].empty());
  CHECK(fetch["X-Idempotency-Operation-Id"].empty());  // not an owner: nothing to trust
  CHECK(replay.result_int() == 201);
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay["Idempotent-Replay-Body"] == "current");
  CHECK(replay[http::field::location] == "/orders/ord-1");
  CHECK(replay[http::field::etag] == "\"v2\"");
  CHECK(replay.body() == R"({"order_id":"ord-1","status":"shipped"})");
  CHECK(f.metrics.refetches("fetched") == 1);
  // The record is untouched: the next stored-mode replay still has the first body.
  CHECK(f.row("k1")->response->body == first.body());
}

TEST_CASE("refetch: a client the backend refuses gets the refusal, nothing of the record") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 201);
  answer_with(f.upstream, 403, R"({"error":"forbidden"})");
  auto refused = f.call(with_credentials(Fixture::order("k1", kBody), "Bearer mallory"));
  CHECK(refused.result_int() == 403);
  CHECK(refused.body() == R"({"error":"forbidden"})");
  CHECK(refused["Idempotent-Replayed"].empty());
  CHECK(refused[http::field::location].empty());
  CHECK(f.metrics.refetches("refused") == 1);
}

TEST_CASE("refetch: a failed fetch is a 502 problem with nothing of the record") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 201);
  SUBCASE("a 5xx") { answer_with(f.upstream, 500, R"({"order_id":"ord-1"})"); }
  SUBCASE("no answer") { f.upstream.fail_next(upstream::Failure::timeout); }
  SUBCASE("a redirect") { answer_with(f.upstream, 302, ""); }
  auto failed = f.call(Fixture::order("k1", kBody));
  CHECK(failed.result_int() == 502);
  CHECK(problem_code(failed) == "replay_refetch_failed");
  CHECK(failed.body().find("ord-1") == std::string::npos);
  CHECK(failed[http::field::location].empty());
  CHECK_FALSE(failed[http::field::retry_after].empty());
  CHECK(f.metrics.refetches("failed") == 1);
  CHECK(f.metrics.requests("create-order", obs::Outcome::replay_failed) == 1);
}

TEST_CASE("refetch: a record without a Location replays its stored bytes") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  answer_with(f.upstream, 422, R"({"error":"out of stock"})");
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 422);
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay.result_int() == 422);
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == first.body());
  CHECK(f.upstream.calls.size() == 1);
}

namespace {

// The create answers 201 with `location` as its Location.
void create_at(ScriptedUpstream& up, std::string location) {
  up.scripts.push_back([location](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    auto out = ScriptedUpstream::created(seq, req);
    out.response.set(http::field::location, location);
    co_return out;
  });
}

}  // namespace

TEST_CASE("refetch: an absolute Location on another host replays the stored bytes; nothing is fetched") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  create_at(f.upstream, "http://other.example/orders/ord-1");
  auto first = f.call(Fixture::order("k1", kBody));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  REQUIRE(f.row("k1")->response->resource_id == "http://other.example/orders/ord-1");

  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(f.upstream.calls.size() == 1);  // the backend saw the create only: no GET of /orders/ord-1
  CHECK(replay.result_int() == 201);
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay["Idempotent-Replay-Body"].empty());  // the stored body, not a current one
  CHECK(replay[http::field::location] == "http://other.example/orders/ord-1");
  CHECK(replay.body() == first.body());
  CHECK(f.metrics.refetches("fetched") == 0);
  CHECK(f.metrics.refetches("failed") == 0);
}

TEST_CASE("refetch: an absolute Location on the request's own host, or a listed one, is re-fetched by its path") {
  Fixture f;
  f.route().replay_mode = settings::ReplayMode::refetch;
  std::string location;
  SUBCASE("the request's Host") { location = "http://SIDECAR/orders/ord-1?view=full"; }
  SUBCASE("a host of replay.hosts") {
    f.route().refetch_hosts = {"orders.example:8443"};
    location = "https://orders.example:8443/orders/ord-1?view=full";
  }
  create_at(f.upstream, location);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  answer_with(f.upstream, 200, R"({"order_id":"ord-1","status":"shipped"})");
  auto replay = f.call(Fixture::order("k1", kBody));
  REQUIRE(f.upstream.calls.size() == 2);
  const auto& fetch = f.upstream.calls[1];
  CHECK(fetch.method() == http::verb::get);
  CHECK(fetch.target() == "/orders/ord-1?view=full");
  CHECK(fetch.body().empty());
  CHECK(replay.result_int() == 201);
  CHECK(replay["Idempotent-Replay-Body"] == "current");
  CHECK(replay[http::field::location] == location);
  CHECK(replay.body() == R"({"order_id":"ord-1","status":"shipped"})");
  CHECK(f.metrics.refetches("fetched") == 1);
}

namespace {

void use_reconcile(Fixture& f) {
  f.route().on_unknown_outcome = settings::UnknownOutcome::reconcile;
  f.route().reconcile.method = "GET";
  f.route().reconcile.path = "/orders/by-operation/{operation_id}";
}

}  // namespace

TEST_CASE("reconcile: a found operation is recorded and answered without a second create") {
  Fixture f;
  use_reconcile(f);
  f.upstream.fail_next(upstream::Failure::timeout);
  auto timed_out = f.call(with_credentials(Fixture::order("k1", kBody), "Bearer alice"));
  REQUIRE(timed_out.result_int() == 504);
  // The lookup answers what the create would have: 201 with the order.
  f.upstream.scripts.push_back([](const upstream::Request& req, int) -> asio::awaitable<upstream::Outcome> {
    co_return ScriptedUpstream::created(1, req);
  });
  auto retry = f.call(with_credentials(Fixture::order("k1", kBody), "Bearer alice"));
  REQUIRE(f.upstream.calls.size() == 2);
  const auto& ask = f.upstream.calls[1];
  const auto op = idempotency::operation_id("t1", "POST /orders", "k1");
  CHECK(ask.method() == http::verb::get);
  CHECK(ask.target() == "/orders/by-operation/" + op);
  CHECK(ask["X-Idempotency-Operation-Id"] == op);
  CHECK(ask["X-Idempotency-Attempt"] == "2");
  CHECK(ask[http::field::authorization] == "Bearer alice");
  CHECK(ask.body().empty());
  CHECK(retry.result_int() == 201);
  CHECK(retry[http::field::location] == "/orders/ord-1");
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(row->attempt == 2);
  CHECK(row->response->resource_id == "/orders/ord-1");
  CHECK(f.metrics.reconciliations("found") == 1);
  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == retry.body());
  CHECK(f.upstream.calls.size() == 2);  // one create, one lookup: nothing else
}

TEST_CASE("reconcile: not found, the request is forwarded again as the next attempt") {
  Fixture f;
  use_reconcile(f);
  f.upstream.fail_next(upstream::Failure::timeout);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 504);
  answer_with(f.upstream, 404, R"({"error":"no such operation"})");
  auto retry = f.call(Fixture::order("k1", kBody));
  CHECK(retry.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 3);
  CHECK(f.upstream.calls[1].method() == http::verb::get);
  CHECK(f.upstream.calls[2].method() == http::verb::post);
  CHECK(f.upstream.calls[2]["X-Idempotency-Attempt"] == "2");
  CHECK(f.upstream.calls[2].body() == kBody);
  CHECK(f.metrics.reconciliations("not_found") == 1);
  CHECK(f.row("k1")->state == store::State::completed);
}

TEST_CASE("reconcile: not known, nothing is forwarded and the next retry asks again") {
  Fixture f;
  use_reconcile(f);
  f.upstream.fail_next(upstream::Failure::timeout);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 504);
  SUBCASE("a 5xx") { answer_with(f.upstream, 503, "{}"); }
  SUBCASE("no answer") { f.upstream.fail_next(upstream::Failure::connect_failed); }
  auto retry = f.call(Fixture::order("k1", kBody));
  CHECK(retry.result_int() == 503);
  CHECK(problem_code(retry) == "reconcile_failed");
  CHECK_FALSE(retry[http::field::retry_after].empty());
  REQUIRE(f.upstream.calls.size() == 2);
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::in_progress);
  CHECK(row->lease_expired);
  CHECK(f.metrics.reconciliations("failed") == 1);
  // The next retry asks again, as attempt 3, and on "found" records.
  f.upstream.scripts.push_back([](const upstream::Request& req, int) -> asio::awaitable<upstream::Outcome> {
    co_return ScriptedUpstream::created(1, req);
  });
  auto third = f.call(Fixture::order("k1", kBody));
  CHECK(third.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 3);
  CHECK(f.upstream.calls[2].method() == http::verb::get);
  CHECK(f.upstream.calls[2]["X-Idempotency-Attempt"] == "3");
}

// ---- Long operations: 202 Accepted and the status resource ---------------------------------

namespace {

void use_async(Fixture& f, Millis after) {
  auto& r = f.route();
  r.async = settings::AsyncSettings{after, "/operations/{operation_id}"};
  r.retry_after = Millis{2000};
  f.configure(f.holder->load()->settings());
}

server::Request status_get(std::string_view location, std::string_view tenant = "t1") {
  server::Request req{http::verb::get, location, 11};
  req.set(http::field::host, "sidecar");
  if (!tenant.empty()) req.set("X-Tenant-Id", tenant);
  return req;
}

// Runs `body` as one coroutine on the fixture's loop, to its end.
void run(Fixture& f, std::function<asio::awaitable<void>()> body) {
  asio::co_spawn(f.ioc, std::move(body), [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  f.ioc.restart();
  f.ioc.run();
}

// Polls (with a deadline, never a fixed sleep) until the gateway has no owner in flight.
asio::awaitable<void> until_no_owner(Fixture& f) {
  asio::steady_timer t(f.ioc);
  for (int i = 0; i < 5000 && f.gw->owners_in_flight() > 0; ++i) {
    t.expires_after(Millis{1});
    co_await t.async_wait(asio::use_awaitable);
  }
  REQUIRE(f.gw->owners_in_flight() == 0);
}

}  // namespace

TEST_CASE("async: past `after` the client gets 202 and a status resource; the operation goes on") {
  Fixture f;
  use_async(f, Millis{20});
  auto gate = f.upstream.hold_next_on_own_gate();
  run(f, [&]() -> asio::awaitable<void> {
    auto first = co_await f.handle(Fixture::order("k1", kBody));
    CHECK(first.result_int() == 202);
    const std::string location(first[http::field::location]);
    const std::string op = idempotency::operation_id("t1", "POST /orders", "k1");
    CHECK(location == "/operations/" + op);
    CHECK(first[http::field::retry_after] == "2");
    CHECK(first.body().find("\"status\":\"in_progress\"") != std::string::npos);
    CHECK(first.body().find("\"attempt\":1") != std::string::npos);
    CHECK_FALSE(first["Idempotency-Key-Expires"].empty());
    CHECK(f.metrics.requests("create-order", obs::Outcome::accepted) == 1);
    CHECK(f.gw->owners_in_flight() == 1);  // the job still owns the record

    auto running = co_await f.handle(status_get(location));
    CHECK(running.result_int() == 200);
    CHECK(running.body().find("\"status\":\"in_progress\"") != std::string::npos);
    CHECK(running.body().find("\"attempt\":1") != std::string::npos);
    CHECK(running.body().find("\"age_seconds\":") != std::string::npos);
    CHECK(running[http::field::cache_control] == "no-store");

    // A duplicate during the operation is pointed at the same status, not refused.
    auto dup = co_await f.handle(Fixture::order("k1", kBody));
    CHECK(dup.result_int() == 202);
    CHECK(dup[http::field::location] == location);

    // Another tenant asking for this id, and anyone asking for an unknown one, learn the
    // same: nothing.
    auto other = co_await f.handle(status_get(location, "t2"));
    auto unknown = co_await f.handle(status_get("/operations/" + std::string(64, 'a')));
    auto malformed = co_await f.handle(status_get("/operations/not-an-id"));
    CHECK(other.result_int() == 404);
    CHECK(problem_code(other) == "operation_not_found");
    CHECK(other.body() == unknown.body());
    CHECK(other.body() == malformed.body());
    CHECK(other.result_int() == unknown.result_int());
    auto anonymous = co_await f.handle(status_get(location, ""));
    CHECK(anonymous.result_int() == 401);

    gate->cancel();  // the upstream answers now
    co_await until_no_owner(f);
    auto done = co_await f.handle(status_get(location));
    CHECK(done.result_int() == 303);
    CHECK(done[http::field::location] == "/orders/ord-1");
    CHECK(done.body().find("\"status\":\"completed\"") != std::string::npos);
    // A retry of the request now replays the one answer.
    auto retry = co_await f.handle(Fixture::order("k1", kBody));
    CHECK(retry.result_int() == 201);
    CHECK(retry["Idempotent-Replayed"] == "true");
  });
  CHECK(f.upstream.calls.size() == 1);
  auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);
  CHECK(row->response->status == 201);
  CHECK(f.metrics.async_operations(obs::Outcome::created) == 1);
}

TEST_CASE("async: an upstream faster than `after` answers as usual, and registers nothing") {
  Fixture f;
  use_async(f, Millis{60000});
  auto first = f.call(Fixture::order("k1", kBody));
  CHECK(first.result_int() == 201);
  CHECK(first[http::field::location] == "/orders/ord-1");
  std::optional<store::OperationRecord> registered;
  run(f, [&]() -> asio::awaitable<void> {
    auto found = co_await f.store.find_operation("t1", idempotency::operation_id("t1", "POST /orders", "k1"));
    REQUIRE(found.has_value());
    registered = *found;
  });
  CHECK_FALSE(registered.has_value());
  CHECK(f.metrics.requests("create-order", obs::Outcome::created) == 1);
  CHECK(f.metrics.async_operations(obs::Outcome::created) == 0);
}

TEST_CASE("async: a completed operation without a resource answers its stored response") {
  Fixture f;
  use_async(f, Millis{20});
  f.upstream.scripts.push_back([&f](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    error_code ec;
    f.upstream.gate.expires_at(SteadyClock::time_point::max());
    co_await f.upstream.gate.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    auto out = ScriptedUpstream::created(seq, req, 422);
    out.response.erase(http::field::location);
    out.response.body() = R"({"error":"out of stock"})";
    out.response.prepare_payload();
    co_return out;
  });
  run(f, [&]() -> asio::awaitable<void> {
    auto first = co_await f.handle(Fixture::order("k1", kBody));
    REQUIRE(first.result_int() == 202);
    const std::string location(first[http::field::location]);
    f.upstream.open_gate();
    co_await until_no_owner(f);
    auto done = co_await f.handle(status_get(location));
    CHECK(done.result_int() == 422);
    CHECK(done.body() == R"({"error":"out of stock"})");
    CHECK(done["Idempotent-Replayed"] == "true");
  });
  CHECK(f.metrics.async_operations(obs::Outcome::created) == 1);
}

TEST_CASE("async: the status of another principal's operation is the unknown one's 404") {
  Fixture f;
  auto s = f.holder->load()->settings();
  s.tenant.principal_header = "X-User-Id";
  s.routes.front().async = settings::AsyncSettings{Millis{20}, "/operations/{operation_id}"};
  f.configure(s);
  auto gate = f.upstream.hold_next_on_own_gate();
  run(f, [&]() -> asio::awaitable<void> {
    auto req = Fixture::order("k1", kBody);
    req.set("X-User-Id", "alice");
    auto first = co_await f.handle(std::move(req));
    REQUIRE(first.result_int() == 202);
    const std::string location(first[http::field::location]);
    auto as_alice = status_get(location);
    as_alice.set("X-User-Id", "alice");
    auto as_bob = status_get(location);
    as_bob.set("X-User-Id", "bob");
    auto mine = co_await f.handle(std::move(as_alice));
    auto theirs = co_await f.handle(std::move(as_bob));
    auto unknown = co_await f.handle(status_get("/operations/" + std::string(64, 'b')));
    CHECK(mine.result_int() == 200);
    CHECK(theirs.result_int() == 404);
    CHECK(theirs.body() == unknown.body());
    gate->cancel();
    co_await until_no_owner(f);
  });
}

TEST_CASE("policy: GET policy_path tells clients each route's key, lifetime and answers") {
  Fixture f;
  use_async(f, Millis{1500});
  auto doc = f.call(status_get("/.well-known/idempotency", ""));
  CHECK(doc.result_int() == 200);
  CHECK(doc[http::field::content_type] == "application/json");
  const std::string want =
      R"({"version":"1","routes":[{"name":"create-order","method":"POST","path":"/orders",)"
      R"("key":{"from":"header","header":"Idempotency-Key","required":true,"max_length":255},)"
      R"("retention_seconds":3600,"mismatch_status":409,"expiry_header":"Idempotency-Key-Expires",)"
      R"("replay":"stored","async":{"after_ms":1500,"status_path":"/operations/{operation_id}"}}]})"
      "\n";
  CHECK(doc.body() == want);
  CHECK(f.upstream.calls.empty());
  // Not served when switched off: the request is the upstream's.
  auto s = f.holder->load()->settings();
  s.policy_path = "";
  f.configure(s);
  f.call(status_get("/.well-known/idempotency", ""));
  CHECK(f.upstream.calls.size() == 1);
}

TEST_CASE("async: the request's trace goes on in the job: the backend and the record see it") {
  Fixture f;
  use_async(f, Millis{60000});
  auto req = Fixture::order("k1", kBody);
  const std::string trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  req.set("traceparent", "00-" + trace + "-00f067aa0ba902b7-01");
  auto first = f.call(std::move(req));
  CHECK(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(std::string(f.upstream.calls[0]["traceparent"]).find(trace) != std::string::npos);
  auto row = f.row("k1");
  REQUIRE(row);
  REQUIRE(row->response);
  CHECK(row->response->trace_id == trace);
}

namespace {

// The fixture's route with its key moved: into the body (Square's idempotency_key) or the
// query (AWS's ClientToken).
void key_in_body(Fixture& f, bool required = true) {
  auto s = f.holder->load()->settings();
  s.routes.front().key.from = settings::KeySource::body;
  s.routes.front().key.pointer = "/idempotency_key";
  s.routes.front().key.required = required;
  s.routes.front().fingerprint.fields.reset();  // the whole body, the key member left out
  s.routes.front().fingerprint.defaults.clear();
  f.configure(s);
}

void key_in_query(Fixture& f) {
  auto s = f.holder->load()->settings();
  s.routes.front().key.from = settings::KeySource::query;
  s.routes.front().key.param = "ClientToken";
  s.routes.front().fingerprint.query = true;
  f.configure(s);
}

server::Request body_order(std::string body, std::string_view tenant = "t1") {
  return Fixture::order("", std::move(body), tenant);
}

server::Request query_order(std::string_view query, std::string body = kBody) {
  auto req = Fixture::order("", std::move(body));
  req.target("/orders?" + std::string(query));
  return req;
}

}  // namespace

TEST_CASE("body key: the member scopes the record, replays, mismatches like the header key") {
  Fixture f;
  key_in_body(f);
  const std::string body = R"({"idempotency_key":"sq-1","amount":1000})";
  auto first = f.call(body_order(body));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0].body() == body);  // forwarded as sent: the backend reads it too
  CHECK(f.upstream.calls[0]["Idempotency-Key"].empty());
  CHECK(f.upstream.calls[0]["X-Idempotency-Operation-Id"] ==
        idempotency::operation_id("t1", "POST /orders", "sq-1"));
  const auto row = f.row("sq-1");
  REQUIRE(row);
  CHECK(row->state == store::State::completed);

  // Member order and spacing do not matter; the key is the member's value.
  auto replay = f.call(body_order(R"({ "amount": 1000, "idempotency_key": "sq-1" })"));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == first.body());
  auto changed = f.call(body_order(R"({"idempotency_key":"sq-1","amount":2000})"));
  CHECK(changed.result_int() == 409);
  CHECK(problem_code(changed) == "idempotency_key_reused");
  // Another key is another operation; another tenant's same key is its own.
  CHECK(f.call(body_order(R"({"idempotency_key":"sq-2","amount":1000})")).result_int() == 201);
  CHECK(f.call(body_order(body, "t2")).result_int() == 201);
  CHECK(f.upstream.calls.size() == 3);
  CHECK(f.store.size() == 3);
}

TEST_CASE("body key: missing, invalid, in the header too or instead: 400, nothing claimed or forwarded") {
  Fixture f;
  key_in_body(f);
  struct Case {
    std::string body;
    std::string header;
    std::string code;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"amount":1})", "", "idempotency_key_missing"},
           {R"({"idempotency_key":"","amount":1})", "", "idempotency_key_invalid"},
           {R"({"idempotency_key":7,"amount":1})", "", "idempotency_key_invalid"},
           {R"({"idempotency_key":"two words"})", "", "idempotency_key_invalid"},
           {R"({"amount":1})", "k-1", "idempotency_key_misplaced"},
           {R"({"idempotency_key":"k-1","amount":1})", "k-1", "idempotency_key_ambiguous"},
           {R"({"idempotency_key":"k-1",)", "", "invalid_json"},
       }) {
    INFO(c.body, " / header ", c.header);
    auto req = Fixture::order(c.header, c.body);
    auto res = f.call(std::move(req));
    CHECK(res.result_int() == 400);
    CHECK(problem_code(res) == c.code);
  }
  CHECK(f.upstream.calls.empty());
  CHECK(f.store.size() == 0);
  CHECK(f.probe.claims == 0);
}

TEST_CASE("body key: a route with required: false passes a body without the member through") {
  Fixture f;
  key_in_body(f, /*required=*/false);
  CHECK(f.call(body_order(R"({"amount":1})")).result_int() == 201);
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.store.size() == 0);
  CHECK(f.metrics.requests("create-order", obs::Outcome::passthrough) == 1);
  // A key in the header instead is still a mistake to say, not a reason to run unprotected.
  CHECK(problem_code(f.call(Fixture::order("k-1", R"({"amount":1})"))) == "idempotency_key_misplaced");
  CHECK(f.call(body_order(R"({"idempotency_key":"k-1","amount":1})")).result_int() == 201);
  CHECK(f.store.size() == 1);
}

TEST_CASE("query key: the parameter scopes the record, replays, mismatches like the header key") {
  Fixture f;
  key_in_query(f);
  auto first = f.call(query_order("ClientToken=tok-1&dry_run=false"));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0].target() == "/orders?ClientToken=tok-1&dry_run=false");
  CHECK(f.row("tok-1")->state == store::State::completed);
  // Parameter order and escaping do not matter, the key's own parameter is not the operation.
  auto replay = f.call(query_order("dry_run=false&Client%54oken=tok-1"));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == first.body());
  CHECK(problem_code(f.call(query_order("ClientToken=tok-1&dry_run=true"))) == "idempotency_key_reused");
  CHECK(problem_code(f.call(query_order("ClientToken=tok-1", R"({"customer_id":"c2","amount":1000})"))) ==
        "idempotency_key_reused");
  CHECK(f.upstream.calls.size() == 1);

  for (const auto& [query, code] : std::vector<std::pair<std::string, std::string>>{
           {"dry_run=false", "idempotency_key_missing"},
           {"ClientToken=a&ClientToken=a", "idempotency_key_invalid"},
           {"ClientToken=a%zz", "idempotency_key_invalid"}}) {
    INFO(query);
    CHECK(problem_code(f.call(query_order(query))) == code);
  }
  auto misplaced = Fixture::order("tok-2", kBody);
  CHECK(problem_code(f.call(std::move(misplaced))) == "idempotency_key_misplaced");
  auto both = query_order("ClientToken=tok-2");
  both.set("Idempotency-Key", "tok-2");
  CHECK(problem_code(f.call(std::move(both))) == "idempotency_key_ambiguous");
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.store.size() == 1);
}

namespace {

void body_format(Fixture& f, settings::BodyFormat format, std::vector<std::string> media_types = {}) {
  auto s = f.holder->load()->settings();
  auto& r = s.routes.front();
  r.fingerprint = settings::FingerprintSettings{};
  r.fingerprint.format = format;
  r.fingerprint.media_types = std::move(media_types);
  if (format == settings::BodyFormat::form) {
    r.key.from = settings::KeySource::body;
    r.key.pointer = "metadata[idempotency_key]";
  }
  f.configure(s);
}

server::Request typed_order(std::string_view key, std::string content_type, std::string body) {
  auto req = Fixture::order(key, std::move(body));
  req.set(http::field::content_type, content_type);
  return req;
}

}  // namespace

TEST_CASE("form body: a key in a form field scopes, replays and mismatches; refusals claim nothing") {
  Fixture f;
  body_format(f, settings::BodyFormat::form);
  const std::string ct = "application/x-www-form-urlencoded";
  const std::string body = "amount=2000&currency=usd&metadata[idempotency_key]=st-1&items[0][price]=p_1";
  auto first = f.call(typed_order("", ct, body));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0].body() == body);
  CHECK(f.row("st-1")->state == store::State::completed);
  auto replay = f.call(typed_order("", ct, "items[][price]=p_1&metadata%5Bidempotency_key%5D=st-1&currency=usd&amount=2000"));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == first.body());
  CHECK(problem_code(f.call(typed_order("", ct, "amount=2001&currency=usd&metadata[idempotency_key]=st-1&items[0][price]=p_1"))) ==
        "idempotency_key_reused");

  for (const auto& [content_type, form, code] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {ct, "amount=1&amount=2&metadata[idempotency_key]=st-2", "invalid_form"},
           {ct, "amount=1&amount[x]=2&metadata[idempotency_key]=st-2", "invalid_form"},
           {ct, "amount=%zz&metadata[idempotency_key]=st-2", "invalid_form"},
           {ct + "; charset=iso-8859-1", "amount=1&metadata[idempotency_key]=st-2", "unsupported_charset"},
           {"application/json", R"({"amount":1})", "unsupported_media_type"},
           {ct, "amount=1", "idempotency_key_missing"},
           {ct, "amount=1&metadata[idempotency_key]", "idempotency_key_invalid"},
       }) {
    INFO(content_type, " / ", form);
    auto res = f.call(typed_order("", content_type, form));
    CHECK(problem_code(res) == code);
    CHECK(res.result_int() == (code.starts_with("unsupported") ? 415 : 400));
  }
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.store.size() == 1);
}

TEST_CASE("raw body: the exact bytes with their media type; others refused before any claim") {
  Fixture f;
  body_format(f, settings::BodyFormat::raw, {"application/x-protobuf"});
  const std::string proto("\x0a\x03" "A-1\x10\x02\x00\xff", 9);
  auto first = f.call(typed_order("k1", "application/x-protobuf", proto));
  REQUIRE(first.result_int() == 201);
  REQUIRE(f.upstream.calls.size() == 1);
  CHECK(f.upstream.calls[0].body() == proto);
  auto replay = f.call(typed_order("k1", "Application/X-Protobuf", proto));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(replay.body() == first.body());
  std::string changed = proto;
  changed.back() = '\xfe';
  CHECK(problem_code(f.call(typed_order("k1", "application/x-protobuf", changed))) == "idempotency_key_reused");
  auto other = f.call(typed_order("k2", "application/json", "{}"));
  CHECK(other.result_int() == 415);
  CHECK(problem_code(other) == "unsupported_media_type");
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.store.size() == 1);
}

namespace {

void same_payload(Fixture& f, settings::SamePayloadAction action) {
  auto s = f.holder->load()->settings();
  s.routes.front().same_payload_new_key = settings::SamePayloadSettings{Millis{600000}, action};
  f.configure(s);
}

}  // namespace

TEST_CASE("same payload, new key: counted and logged under count; the order still goes through") {
  Fixture f;
  same_payload(f, settings::SamePayloadAction::count);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  CHECK(f.metrics.same_payload_new_keys("create-order") == 0);
  // The client's retry with a new key: the same order.
  auto second = f.call(Fixture::order("k2", kBody));
  CHECK(second.result_int() == 201);
  CHECK(second["Idempotency-Warning"].empty());  // count says nothing to the client
  CHECK(f.metrics.same_payload_new_keys("create-order") == 1);
  // A retry of k2 itself is no new key; a genuinely different order is no reuse.
  CHECK(f.call(Fixture::order("k2", kBody))["Idempotent-Replayed"] == "true");
  CHECK(f.call(Fixture::order("k3", R"({"customer_id":"c1","amount":2000,"currency":"EUR"})")).result_int() == 201);
  CHECK(f.metrics.same_payload_new_keys("create-order") == 1);
  CHECK(f.upstream.calls.size() == 3);
  CHECK(f.probe.notes == 3);  // one per new key; the replay noted nothing
}

TEST_CASE("same payload, new key: warn adds Idempotency-Warning naming the earlier operation") {
  Fixture f;
  same_payload(f, settings::SamePayloadAction::warn);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  auto second = f.call(Fixture::order("k2", kBody));
  CHECK(second.result_int() == 201);
  CHECK(second["Idempotency-Warning"] ==
        "same_payload_new_key; earlier_operation_id=\"" + idempotency::operation_id("t1", "POST /orders", "k1") + "\"");
  // Never recorded: k2's replay is not the moment of the mistake.
  CHECK(f.call(Fixture::order("k2", kBody))["Idempotency-Warning"].empty());
  CHECK(f.upstream.calls.size() == 2);
  // A backend cannot make an answer carry it.
  f.upstream.scripts.push_back([](const upstream::Request& req, int seq) -> asio::awaitable<upstream::Outcome> {
    auto out = ScriptedUpstream::created(seq, req);
    out.response.set("Idempotency-Warning", "forged");
    co_return out;
  });
  CHECK(f.call(Fixture::order("k9", R"({"customer_id":"c9","amount":1,"currency":"EUR"})"))["Idempotency-Warning"].empty());
}

TEST_CASE("same payload, new key: reject answers 409 naming the earlier operation; nothing forwarded or kept") {
  Fixture f;
  same_payload(f, settings::SamePayloadAction::reject);
  REQUIRE(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  for (const char* key : {"k2", "k3", "k2"}) {
    INFO(key);
    auto refused = f.call(Fixture::order(key, kBody));
    CHECK(refused.result_int() == 409);
    CHECK(problem_code(refused) == "same_payload_new_key");
    CHECK(refused.body().find("\"earlier_operation_id\":\"" + idempotency::operation_id("t1", "POST /orders", "k1") +
                              "\"") != std::string::npos);
    CHECK_FALSE(f.row(key).has_value());  // the claim was released
  }
  CHECK(f.upstream.calls.size() == 1);
  CHECK(f.metrics.same_payload_new_keys("create-order") == 3);
  CHECK(f.metrics.requests("create-order", obs::Outcome::rejected) == 3);
  // The earlier key replays; another order is its own; another tenant's same order too.
  CHECK(f.call(Fixture::order("k1", kBody))["Idempotent-Replayed"] == "true");
  CHECK(f.call(Fixture::order("k4", R"({"customer_id":"c2","amount":1000,"currency":"EUR"})")).result_int() == 201);
  CHECK(f.call(Fixture::order("k2", kBody, "t2")).result_int() == 201);
  CHECK(f.upstream.calls.size() == 3);
}

TEST_CASE("same payload, new key: a failed note lets count forward, and makes reject fail closed") {
  Fixture f;
  same_payload(f, settings::SamePayloadAction::count);
  f.probe.fail_notes = true;
  CHECK(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  CHECK(f.upstream.calls.size() == 1);
  same_payload(f, settings::SamePayloadAction::reject);
  auto res = f.call(Fixture::order("k2", kBody));
  CHECK(res.result_int() == 503);
  CHECK(problem_code(res) == "idempotency_store_unavailable");
  CHECK(f.upstream.calls.size() == 1);
  CHECK_FALSE(f.row("k2").has_value());
}

// --- examine(): the gateway's admission without I/O (idemproxy explain) -------------------

namespace {

// examine() on a copy of `req` (it changes the request as handle() does), then handle()
// on the request itself: what examine() found must be what the sidecar recorded.
gateway::Examination examine_then_handle(Fixture& f, const server::Request& req, server::Response* answer) {
  server::Request copy = req;
  server::RequestContext ctx;
  auto e = gateway::examine(f.holder->load(), copy, ctx);
  *answer = f.call(req);
  return e;
}

}  // namespace

TEST_CASE("examine: the fingerprint and operation id are the ones the sidecar records and sends") {
  Fixture f;
  server::Response answer;
  const auto e = examine_then_handle(f, Fixture::order("k1", R"({"amount":1e3,"customer_id":"c1"})"), &answer);
  REQUIRE(e.way == gateway::Examination::Way::protected_request);
  REQUIRE(answer.result_int() == 201);
  CHECK(e.fingerprint == idempotency::sha256_hex(e.canonical));  // the text shown is what is hashed
  const auto row = f.row("k1");
  REQUIRE(row);
  CHECK(row->fingerprint == e.fingerprint);
  CHECK(e.id.tenant == "t1");
  CHECK(e.id.endpoint == "POST /orders");
  CHECK(e.id.key == "k1");
  CHECK(e.operation_id == f.upstream.calls.at(0)["X-Idempotency-Operation-Id"]);
  // The default of /currency is in the text that is hashed.
  CHECK(e.canonical.find(R"("/currency":"EUR")") != std::string::npos);
}

TEST_CASE("examine: a form body with its key in a field, on a templated path, is read as handle() reads it") {
  Fixture f;
  body_format(f, settings::BodyFormat::form);
  auto s = f.holder->load()->settings();
  s.routes.front().path = "/accounts/{id}/orders";
  f.configure(s);
  auto req = typed_order("", "application/x-www-form-urlencoded",
                         "amount=2000&currency=usd&metadata[idempotency_key]=st-1");
  req.target("/accounts/a-7/orders");
  server::Response answer;
  const auto e = examine_then_handle(f, req, &answer);
  REQUIRE(e.way == gateway::Examination::Way::protected_request);
  REQUIRE(answer.result_int() == 201);
  CHECK(e.key == "st-1");
  CHECK(e.fingerprint == idempotency::sha256_hex(e.canonical));
  // The concrete path joins the fingerprint on a templated route; the key field does not.
  CHECK(e.canonical.find("/accounts/a-7/orders") != std::string::npos);
  CHECK(e.canonical.find("st-1") == std::string::npos);
  const auto row = f.row("st-1");
  REQUIRE(row);
  CHECK(row->fingerprint == e.fingerprint);
}

TEST_CASE("examine: refusals, pass-throughs and the route it matched, as handle() answers them") {
  Fixture f;
  auto s = f.holder->load()->settings();
  settings::RouteSettings optional = s.routes.front();
  optional.name = "optional";
  optional.path = "/carts";
  optional.scope = "POST /carts";
  optional.key.required = false;
  s.routes.push_back(optional);
  f.configure(s);
  using Way = gateway::Examination::Way;
  struct Case {
    server::Request req;
    Way way;
    std::string code;
  };
  auto bad_key = Fixture::order("two words", kBody);
  auto no_tenant = Fixture::order("k2", kBody, "");
  auto not_json = typed_order("k3", "application/json", "{");
  auto unmatched = Fixture::order("k4", kBody);
  unmatched.target("/order");
  auto resembling = Fixture::order("k5", kBody);
  resembling.target("/Orders");
  auto keyless = Fixture::order("", kBody);
  keyless.target("/carts");
  for (auto& c : std::vector<Case>{{bad_key, Way::answered, "idempotency_key_invalid"},
                                   {no_tenant, Way::answered, "tenant_missing"},
                                   {not_json, Way::answered, "invalid_json"},
                                   {unmatched, Way::pass_through, ""},
                                   {resembling, Way::answered, "bad_request"},
                                   {keyless, Way::pass_through_no_key, ""}}) {
    INFO(c.req.target(), " ", c.code);
    server::Response answer;
    const auto calls_before = f.upstream.calls.size();
    const auto e = examine_then_handle(f, c.req, &answer);
    CHECK(e.way == c.way);
    CHECK(e.code == c.code);
    if (c.way == Way::answered) {
      REQUIRE(e.answer);
      CHECK(e.answer->result_int() == answer.result_int());
      CHECK(e.answer->body() == answer.body());
      CHECK(f.upstream.calls.size() == calls_before);
    } else {
      CHECK(f.upstream.calls.size() == calls_before + 1);  // forwarded, unprotected
    }
  }
  CHECK(f.store.size() == 0);
}

TEST_CASE("a byte-identical retry takes its fingerprint from the memo; other bytes are fingerprinted again") {
  Fixture f;
  CHECK(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  CHECK(f.metrics.fingerprint_memo_lookups(true) == 0);
  CHECK(f.metrics.fingerprint_memo_lookups(false) == 1);

  auto replay = f.call(Fixture::order("k1", kBody));
  CHECK(replay["Idempotent-Replayed"] == "true");
  CHECK(f.metrics.fingerprint_memo_lookups(true) == 1);

  // A different amount: not in the memo, fingerprinted, refused as before.
  auto reused = f.call(Fixture::order("k1", R"({"customer_id":"c1","amount":1001,"currency":"EUR"})"));
  CHECK(reused.result_int() == 409);
  CHECK(problem_code(reused) == "idempotency_key_reused");
  CHECK(f.metrics.fingerprint_memo_lookups(false) == 2);
  // The same JSON in other bytes: fingerprinted again, and still the same operation.
  auto spaced = f.call(Fixture::order("k1", R"({"customer_id": "c1", "amount": 1000, "currency": "EUR"})"));
  CHECK(spaced["Idempotent-Replayed"] == "true");
  CHECK(f.metrics.fingerprint_memo_lookups(false) == 3);
  // Another tenant's identical bytes are its own entry.
  CHECK(f.call(Fixture::order("k1", kBody, "t2")).result_int() == 201);
  CHECK(f.metrics.fingerprint_memo_lookups(true) == 1);
  CHECK(f.metrics.fingerprint_memo_lookups(false) == 4);
  CHECK(f.upstream.calls.size() == 2);
  CHECK(f.store.size() == 2);
}

TEST_CASE("after a reload that changes the fingerprint, the memo's old fingerprints are not used") {
  Fixture f;
  CHECK(f.call(Fixture::order("k1", kBody)).result_int() == 201);
  CHECK(f.call(Fixture::order("k1", kBody))["Idempotent-Replayed"] == "true");
  const auto stored = f.row("k1");
  REQUIRE(stored);

  // The route now fingerprints the customer only: the same bytes are another operation
  // under the new configuration, so the key is refused, not replayed.
  settings::Settings next = f.holder->load()->settings();
  next.routes.front().fingerprint.fields = std::vector<std::string>{"/customer_id"};
  next.routes.front().fingerprint.defaults.clear();
  f.reload(std::move(next));
  const auto hits = f.metrics.fingerprint_memo_lookups(true);
  auto res = f.call(Fixture::order("k1", kBody));
  CHECK(res.result_int() == 409);
  CHECK(problem_code(res) == "idempotency_key_reused");
  CHECK(f.metrics.fingerprint_memo_lookups(true) == hits);
  CHECK(f.upstream.calls.size() == 1);
  const auto after = f.row("k1");
  REQUIRE(after);
  CHECK(after->fingerprint == stored->fingerprint);
}
