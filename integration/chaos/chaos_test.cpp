// The pure parts of the fault-injection run: the workload (seeded, and every form of a
// body fingerprinting the same under the run's route, by the sidecar's own fingerprint
// code), the fault list and schedule, the fault proxy's control vocabulary, and above all
// the checker: each rule shown to fire on a history that breaks it, and to stay quiet on
// one that does not.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "checker.hpp"
#include "failover_report.hpp"
#include "faults.hpp"
#include "history.hpp"
#include "idempotency/fingerprint.hpp"
#include "idempotency/key.hpp"
#include "link_mode.hpp"
#include "migrate_log.hpp"
#include "workload.hpp"

using namespace idem::chaos;

namespace {

// The fingerprint of the run's route (topology.cpp, the same as config/demo.yaml).
std::string fingerprint_of(const std::string& body) {
  idem::settings::FingerprintSettings s;
  s.fields = std::vector<std::string>{"/customer_id", "/currency",    "/amount",
                                      "/items",       "/checkout_id", "/coupon"};
  s.defaults = {{"/currency", "\"EUR\""}};
  static const auto spec = idem::idempotency::FingerprintSpec::compile(s);
  idem::idempotency::RequestParts parts;
  parts.method = "POST";
  parts.scope = "POST /orders";
  parts.content_type = "application/json";
  parts.body = body;
  const auto r = idem::idempotency::fingerprint(spec, parts);
  REQUIRE(r.status == idem::idempotency::FingerprintStatus::ok);
  return r.value;
}

std::set<std::string> rules(const CheckResult& r) {
  std::set<std::string> out;
  for (const auto& v : r.violations) out.insert(v.rule);
  return out;
}

// A hand-made run: one operation, its entries and answers, and the rows.
struct Scenario {
  Plan plan;
  std::vector<Attempt> history;
  Snapshot rows;
  std::int64_t clock = 0;

  Scenario() {
    Operation op{.id = 0, .tenant = "tenant-a", .key = "key-1"};
    op.bodies[0] = OrderBody{.customer_id = "cust-1", .currency = "EUR", .amount = 1000,
                             .items = {{"SKU-1", 2}}, .checkout_id = "co-1"};
    op.bodies[1] = op.bodies[0];
    op.bodies[1].amount = 1001;
    plan.tenants = {"tenant-a", "tenant-b"};
    plan.operations.push_back(op);
    Operation other = op;
    other.id = 1;
    other.tenant = "tenant-b";
    plan.operations.push_back(other);
  }

  static std::string order(const std::string& id, std::int64_t amount = 1000) {
    return R"({"order_id":")" + id + R"(","checkout_id":"co-1","customer_id":"cust-1",)"
           R"("currency":"EUR","amount":)" + std::to_string(amount) +
           R"(,"discount":0,"total":)" + std::to_string(amount) +
           R"(,"coupon":null,"items":[{"sku":"SKU-1","qty":2}],"status":"created"})";
  }

  std::size_t entry(EntryKind kind = EntryKind::first, int body = 0, std::size_t op = 0) {
    plan.entries.push_back(Entry{op, kind, body});
    return plan.entries.size() - 1;
  }

  // An answer to entry `e`, sent now and received 10 us later.
  Attempt& answer(std::size_t e, int status, std::string code = "", bool replayed = false,
                  std::string body = "") {
    Attempt a;
    a.entry = e;
    a.operation = plan.entries[e].operation;
    a.tenant = plan.operations[a.operation].tenant;
    a.key = plan.operations[a.operation].key;
    a.body = plan.entries[e].body;
    int n = 0;
    for (const auto& h : history) n += h.entry == e ? 1 : 0;
    a.attempt = n + 1;
    a.sent_us = clock += 100;
    a.received_us = clock += 10;
    a.status = status;
    a.code = std::move(code);
    a.replayed = replayed;
    if (a.definite()) a.body_text = std::move(body);
    history.push_back(a);
    return history.back();
  }

  void order_row(const std::string& id, const std::string& tenant = "tenant-a",
                 std::int64_t amount = 1000) {
    rows.orders.push_back({id, tenant, "cust-1", amount, "co-1", std::nullopt});
  }
  void record(const std::string& body, const std::string& tenant = "tenant-a", int status = 201) {
    rows.records.push_back({tenant, "key-1", "completed", status, body, 2});
  }

  CheckResult check() const { return idem::chaos::check(plan, plan.entries.size(), history, rows); }
};

// The common happy shape: a first try that fails, a retry that creates, a replay.
Scenario healthy() {
  Scenario s;
  const auto e = s.entry();
  s.answer(e, 503, "injected_fault");
  s.answer(e, 201, "", false, Scenario::order("o-1"));
  const auto r = s.entry(EntryKind::replay);
  s.answer(r, 201, "", true, Scenario::order("o-1"));
  s.order_row("o-1");
  s.record(Scenario::order("o-1"));
  return s;
}

}  // namespace

// ----------------------------------------------------------------------- workload

TEST_CASE("chaos plan: the seed decides it, and it has every kind of entry") {
  const PlanOptions options{.entries = 3000};
  const Plan a = make_plan(42, options);
  const Plan b = make_plan(42, options);
  const Plan c = make_plan(43, options);
  REQUIRE(a.entries.size() == 3000);
  CHECK(a.operations.size() == b.operations.size());
  bool same = true, differs = false;
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    same = same && a.entries[i].operation == b.entries[i].operation &&
           a.entries[i].kind == b.entries[i].kind;
    differs = differs || a.entries[i].operation != c.entries[i].operation ||
              a.entries[i].kind != c.entries[i].kind;
  }
  CHECK(same);
  CHECK(differs);

  std::set<EntryKind> kinds;
  std::set<std::string> tenants_of_one_key;
  for (const auto& e : a.entries) kinds.insert(e.kind);
  CHECK(kinds.size() == 4);
  // The same raw key, and the same body, in several tenants.
  std::map<std::string, std::set<std::string>> tenants_by_key;
  for (const auto& op : a.operations) tenants_by_key[op.key].insert(op.tenant);
  std::size_t shared = 0;
  for (const auto& [key, tenants] : tenants_by_key) shared += tenants.size() > 1 ? 1 : 0;
  CHECK(shared > 100);
  // Every reuse entry uses the other body; nothing else does.
  for (const auto& e : a.entries) CHECK((e.kind == EntryKind::reuse) == (e.body == 1));
}

TEST_CASE("chaos forms: every form of a body has its fingerprint, the other body another") {
  const Plan plan = make_plan(7, PlanOptions{.entries = 200});
  Rng rng(99);
  for (const auto& op : plan.operations) {
    const std::string expected = fingerprint_of(render_body(op.bodies[0], 0));
    CHECK(fingerprint_of(render_body(op.bodies[1], 0)) != expected);
    for (int i = 0; i < 20; ++i) {
      const auto form = static_cast<std::uint32_t>(rng.next());
      const std::string body = render_body(op.bodies[0], form);
      CAPTURE(body);
      CHECK(fingerprint_of(body) == expected);
      // The key, bare or as an RFC 8941 string, is the same key for the sidecar.
      const std::string sent = render_key(op.key, form);
      const std::string_view values[] = {sent};
      const auto key = idem::idempotency::parse_key(values, 255);
      CHECK(key.status == idem::idempotency::KeyStatus::ok);
      CHECK(key.key == op.key);
    }
  }
  // The forms really differ in bytes: member order, numbers, omitted defaults, extras.
  std::set<std::string> distinct;
  for (std::uint32_t form = 0; form < 4096; form += 7) {
    distinct.insert(render_body(plan.operations[0].bodies[0], form));
  }
  CHECK(distinct.size() > 100);
}

// -------------------------------------------------------------------------- faults

TEST_CASE("chaos faults: lists, groups and their errors") {
  const auto all = std::get<FaultSet>(parse_faults("all"));
  CHECK(all.kinds.size() == all_fault_kinds().size());
  CHECK(all.combos);
  const auto some = std::get<FaultSet>(parse_faults("pause, backend-503-after,net"));
  CHECK(some.kinds.size() == 6);
  CHECK_FALSE(some.combos);
  CHECK(describe(some) == "pause,backend-503-after,net-delay,net-blackhole,net-reset,net-refuse");
  CHECK(std::get<FaultSet>(parse_faults("none")).empty());
  CHECK(std::get<FaultSet>(parse_faults("process,combo")).combos);
  CHECK(std::get<std::string>(parse_faults("pause,explode")) == "unknown fault 'explode'");
  CHECK(std::holds_alternative<std::string>(parse_faults("none,kill")));
  CHECK(std::holds_alternative<std::string>(parse_faults("combo")));
}

TEST_CASE("chaos schedule: seeded, within the list, pauses outlast the lease") {
  const auto set = std::get<FaultSet>(parse_faults("all"));
  const FaultTimings timings{.lease = Millis(1000), .response_timeout = Millis(1000)};
  Schedule a(5, set, timings), b(5, set, timings);
  std::map<FaultKind, int> seen;
  int combos = 0, failing_then_pause = 0;
  for (int i = 0; i < 500; ++i) {
    const Step x = a.next();
    const Step y = b.next();
    REQUIRE(x.faults.size() == y.faults.size());
    REQUIRE_FALSE(x.faults.empty());
    combos += x.faults.size() > 1 ? 1 : 0;
    for (std::size_t f = 0; f < x.faults.size(); ++f) {
      CHECK(x.faults[f].detail() == y.faults[f].detail());
      ++seen[x.faults[f].kind];
      if (x.faults[f].kind == FaultKind::pause) CHECK(x.faults[f].hold > timings.lease);
      if (x.faults[f].kind == FaultKind::backend_slow) CHECK(x.faults[f].delay > Millis(0));
      if (x.faults[f].kind == FaultKind::net_delay) CHECK(!x.faults[f].links.empty());
    }
    if (x.faults.size() == 2) {
      CHECK(x.faults[0].start == Millis(0));
      CHECK(x.faults[1].start >= x.faults[0].start);
      if (x.faults[0].kind == x.faults[1].kind && x.faults[0].kind == FaultKind::pause) {
        CHECK(x.faults[0].replica != x.faults[1].replica);
      }
      // A backend failure paired with a pause comes first; the pause catches its claims.
      if (x.faults[1].kind == FaultKind::pause &&
          (x.faults[0].kind == FaultKind::backend_503_after ||
           x.faults[0].kind == FaultKind::backend_503_before)) {
        ++failing_then_pause;
        CHECK(x.faults[1].start >= Millis(200));
      }
      CHECK_FALSE((x.faults[0].kind == FaultKind::pause &&
                   (x.faults[1].kind == FaultKind::backend_503_after ||
                    x.faults[1].kind == FaultKind::backend_503_before)));
    }
  }
  CHECK(seen.size() == all_fault_kinds().size());
  CHECK(combos > 100);
  CHECK(failing_then_pause > 10);

  Schedule only(5, std::get<FaultSet>(parse_faults("pg")), timings);
  for (int i = 0; i < 50; ++i) {
    const Step s = only.next();
    REQUIRE(s.faults.size() == 1);
    CHECK((s.faults[0].kind == FaultKind::pg_restart_fast ||
           s.faults[0].kind == FaultKind::pg_restart_immediate));
  }
}

TEST_CASE("fault proxy modes: parsed strictly, rendered back") {
  CHECK(std::get<LinkMode>(parse_link_mode(R"({"mode":"pass"})")) == LinkMode{});
  const auto delay = std::get<LinkMode>(parse_link_mode(R"({"mode":"delay","delay_ms":250})"));
  CHECK(delay.kind == LinkKind::delay);
  CHECK(delay.delay.count() == 250);
  CHECK(render_link_mode(delay) == R"({"mode":"delay","delay_ms":250})");
  CHECK(render_link_mode(LinkMode{.kind = LinkKind::refuse}) == R"({"mode":"refuse"})");
  for (const char* bad : {"", "[]", R"({"mode":"drop"})", R"({"mode":"delay"})",
                          R"({"mode":"delay","delay_ms":0})", R"({"mode":"reset","delay_ms":5})",
                          R"({"mode":"pass","extra":1})"}) {
    CAPTURE(bad);
    CHECK(std::holds_alternative<std::string>(parse_link_mode(bad)));
  }
}

// ------------------------------------------------------------------------- checker

TEST_CASE("checker: a healthy history passes, and its answers are counted") {
  const auto r = healthy().check();
  CHECK(r.violations.empty());
  CHECK(r.requests == 3);
  CHECK(r.answers[static_cast<std::size_t>(AnswerClass::created)] == 1);
  CHECK(r.answers[static_cast<std::size_t>(AnswerClass::replayed)] == 1);
  CHECK(r.answers[static_cast<std::size_t>(AnswerClass::backend_5xx)] == 1);
}

TEST_CASE("checker: a success with no completed record is a lost record") {
  Scenario s = healthy();
  s.rows.records.clear();
  CHECK(rules(s.check()) == std::set<std::string>{"lost_record"});
  s.rows.records.push_back({"tenant-a", "key-1", "in_progress", std::nullopt, std::nullopt, 3});
  CHECK(rules(s.check()) == std::set<std::string>{"lost_record", "stuck_in_progress"});
}

TEST_CASE("checker: a record holding another answer differs") {
  Scenario s = healthy();
  s.rows.records[0].body = Scenario::order("o-2");
  CHECK(rules(s.check()) == std::set<std::string>{"record_differs"});
}

TEST_CASE("checker: two first answers for one key") {
  Scenario s = healthy();
  const auto d = s.entry(EntryKind::duplicate);
  // Sent before the first success arrived: only the count of first answers catches it.
  Attempt& late = s.answer(d, 201, "", false, Scenario::order("o-1"));
  late.sent_us = 1;  // before anything was delivered
  CHECK(rules(s.check()) == std::set<std::string>{"second_first_answer"});
}

TEST_CASE("checker: after a delivered answer, only replays") {
  SUBCASE("executed again") {
    Scenario s = healthy();
    const auto r = s.entry(EntryKind::replay);
    s.answer(r, 201, "", false, Scenario::order("o-1"));
    CHECK(rules(s.check()) == std::set<std::string>{"executed_after_answer", "second_first_answer"});
  }
  SUBCASE("in progress") {
    Scenario s = healthy();
    const auto r = s.entry(EntryKind::replay);
    s.answer(r, 409, "idempotency_in_progress");
    s.answer(r, 201, "", true, Scenario::order("o-1"));
    CHECK(rules(s.check()) == std::set<std::string>{"in_progress_after_answer"});
  }
  SUBCASE("forwarded") {
    Scenario s = healthy();
    const auto r = s.entry(EntryKind::replay);
    s.answer(r, 504, "upstream_timeout");
    s.answer(r, 201, "", true, Scenario::order("o-1"));
    CHECK(rules(s.check()) == std::set<std::string>{"forwarded_after_answer"});
  }
  SUBCASE("a store outage and a lost connection are fine") {
    Scenario s = healthy();
    const auto r = s.entry(EntryKind::replay);
    s.answer(r, 503, "idempotency_store_unavailable");
    s.answer(r, 0).error = "connection reset";
    s.answer(r, 201, "", true, Scenario::order("o-1"));
    CHECK(s.check().violations.empty());
  }
}

TEST_CASE("checker: answers of one key must be one answer") {
  Scenario s = healthy();
  const auto r = s.entry(EntryKind::replay);
  s.answer(r, 201, "", true, Scenario::order("o-2"));
  s.order_row("o-2");  // so that only the divergence (and the second order) is reported
  CHECK(rules(s.check()) == std::set<std::string>{"divergent_answers", "duplicate_order"});
}

TEST_CASE("checker: another tenant's order in an answer") {
  Scenario s = healthy();
  s.rows.orders[0].tenant = "tenant-b";
  CHECK(rules(s.check()) == std::set<std::string>{"foreign_order"});
  Scenario gone = healthy();
  gone.rows.orders.clear();
  CHECK(rules(gone.check()) == std::set<std::string>{"foreign_order"});
}

TEST_CASE("checker: an order for another body than the request's") {
  Scenario s;
  const auto e = s.entry();
  s.answer(e, 201, "", false, Scenario::order("o-1", 1001));
  s.order_row("o-1", "tenant-a", 1001);
  s.record(Scenario::order("o-1", 1001));
  CHECK(rules(s.check()) == std::set<std::string>{"answer_for_other_request"});
}

TEST_CASE("checker: key reuse") {
  SUBCASE("the other body refused, later: fine") {
    Scenario s = healthy();
    const auto u = s.entry(EntryKind::reuse, 1);
    s.answer(u, 409, "idempotency_key_reused");
    CHECK(s.check().violations.empty());
  }
  SUBCASE("the other body won the race: the first body is refused") {
    Scenario s;
    const auto e = s.entry();
    const auto u = s.entry(EntryKind::reuse, 1);
    s.answer(u, 201, "", false, Scenario::order("o-1", 1001));
    s.answer(e, 409, "idempotency_key_reused");
    s.order_row("o-1", "tenant-a", 1001);
    s.record(Scenario::order("o-1", 1001));
    CHECK(s.check().violations.empty());
  }
  SUBCASE("the same body refused as reused, after its result") {
    Scenario s = healthy();
    const auto d = s.entry(EntryKind::duplicate);
    s.answer(d, 409, "idempotency_key_reused");
    CHECK(rules(s.check()) == std::set<std::string>{"same_body_refused"});
  }
  SUBCASE("the same body refused while the other body held the key: fine") {
    Scenario s = healthy();
    const auto d = s.entry(EntryKind::duplicate);
    s.answer(d, 409, "idempotency_key_reused").sent_us = 1;
    CHECK(s.check().violations.empty());
  }
  SUBCASE("both bodies succeeded") {
    Scenario s = healthy();
    const auto u = s.entry(EntryKind::reuse, 1);
    Attempt& a = s.answer(u, 201, "", true, Scenario::order("o-1"));
    a.sent_us = 1;
    CHECK(rules(s.check()).contains("two_bodies_succeeded"));
  }
  SUBCASE("every answer a refusal") {
    Scenario s;
    const auto e = s.entry();
    s.answer(e, 409, "idempotency_key_reused");
    CHECK(rules(s.check()) == std::set<std::string>{"no_result"});
  }
}

TEST_CASE("checker: two claims of a key with one fencing token") {
  Scenario s = healthy();
  s.rows.orders[0].operation_id = "op-1";
  s.rows.arrivals = {{"tenant-a", "op-1", 1, 7}, {"tenant-a", "op-1", 2, 9}, {"tenant-b", "op-1", 1, 7}};
  auto r = s.check();
  CHECK(r.violations.empty());
  CHECK(r.arrivals == 3);
  s.rows.arrivals.push_back({"tenant-a", "op-1", 1, 7});
  r = s.check();
  REQUIRE(rules(r) == std::set<std::string>{"fencing_token_reused"});
  CHECK(r.violations[0].detail.find("tenant-a/cust-1") != std::string::npos);
  // A sidecar that sends no token cannot be checked this way, and is not blamed.
  s.rows.arrivals = {{"tenant-a", "op-1", 1, std::nullopt}, {"tenant-a", "op-1", 1, std::nullopt}};
  CHECK(s.check().violations.empty());
}

TEST_CASE("checker: unsettled entries, unexpected answers, duplicate orders") {
  Scenario s = healthy();
  const auto e = s.entry();
  s.answer(e, 409, "idempotency_in_progress").sent_us = 1;
  CHECK(rules(s.check()) == std::set<std::string>{"no_definite_answer"});

  Scenario odd = healthy();
  const auto o = odd.entry(EntryKind::duplicate);
  odd.answer(o, 400, "invalid_request").sent_us = 1;
  CHECK(rules(odd.check()).contains("unexpected_answer"));

  Scenario twice = healthy();
  twice.order_row("o-9");
  CHECK(rules(twice.check()) == std::set<std::string>{"duplicate_order"});

  Scenario never;
  never.entry();
  CHECK(rules(never.check()) == std::set<std::string>{"no_definite_answer"});
}

TEST_CASE("checker: a request forwarded on a claim the store does not hold") {
  Scenario s = healthy();
  s.rows.orders[0].operation_id = "op-1";
  s.rows.arrivals = {{"tenant-a", "op-1", 1, 7}, {"tenant-a", "op-1", 2, 9}};
  // Without the witness the rule cannot be checked, and is not.
  CHECK(s.check().violations.empty());
  s.rows.claims_witnessed = true;
  s.rows.claims = {{"tenant-a", "op-1", 7}, {"tenant-a", "op-1", 9}, {"tenant-a", "op-1", 12}};
  auto r = s.check();
  CHECK(r.violations.empty());
  CHECK(r.arrivals_with_claim == 2);
  // Token 9 reached the backend, but no claim with it survived (a failover lost it): the
  // same token of another tenant's operation is no alibi.
  s.rows.claims = {{"tenant-a", "op-1", 7}, {"tenant-b", "op-1", 9}};
  r = s.check();
  REQUIRE(rules(r) == std::set<std::string>{"forwarded_without_claim"});
  CHECK(r.violations[0].detail.find("tenant-a/cust-1") != std::string::npos);
  CHECK(r.violations[0].detail.find("fencing token 9") != std::string::npos);
}

// ---------------------------------------------------------------- failover runs

TEST_CASE("chaos faults: the failover kinds are a group of their own, never in all") {
  const auto failover = std::get<FaultSet>(parse_faults("failover"));
  CHECK(failover.kinds == std::set<FaultKind>{FaultKind::pg_failover, FaultKind::pg_failover_vanish,
                                              FaultKind::pg_switchover});
  const auto all = std::get<FaultSet>(parse_faults("all"));
  for (const auto k : all.kinds) CHECK_FALSE(is_failover(k));
  CHECK(describe(all) == "all");
  CHECK(describe(std::get<FaultSet>(parse_faults("all,pg-switchover"))) != "all");

  // Every step is a failover, the kinds in turn; partners join half the time.
  const FaultTimings timings{.lease = Millis(1000), .response_timeout = Millis(1000)};
  Schedule schedule(9, std::get<FaultSet>(parse_faults("failover,kill,combo")), timings);
  int partners = 0;
  for (int i = 0; i < 60; ++i) {
    const Step step = schedule.next();
    REQUIRE_FALSE(step.faults.empty());
    CHECK(step.faults[0].kind == std::vector<FaultKind>{FaultKind::pg_failover,
                                                        FaultKind::pg_failover_vanish,
                                                        FaultKind::pg_switchover}[i % 3]);
    if (step.faults[0].kind != FaultKind::pg_switchover) CHECK(step.faults[0].hold >= Millis(1000));
    if (step.faults.size() == 2) {
      ++partners;
      CHECK(step.faults[1].kind == FaultKind::kill);
      CHECK(step.faults[1].start <= Millis(7000));
    }
  }
  CHECK(partners > 15);
  CHECK(partners < 45);
}

namespace {

Attempt at(int replica, std::int64_t sent_ms, std::int64_t received_ms, int status,
           std::string code = "", bool replayed = false) {
  Attempt a;
  a.replica = replica;
  a.sent_us = sent_ms * 1000;
  a.received_us = received_ms * 1000;
  a.status = status;
  a.code = std::move(code);
  a.replayed = replayed;
  return a;
}

NemesisEvent ev(std::int64_t at_ms, std::string action, std::string fault, std::string detail = "") {
  return NemesisEvent{.at_us = at_ms * 1000, .action = std::move(action), .fault = std::move(fault),
                      .detail = std::move(detail)};
}

}  // namespace

TEST_CASE("failover report: promotion, the 503 window and the first new order") {
  const std::string u = "idempotency_store_unavailable";
  const std::vector<Attempt> history{
      at(0, 900, 950, 201),                      // before the kill
      at(0, 990, 1010, 201),                     // sent before, answered after: not a recovery
      at(0, 1001, 1005, 503, u),                 // first 503
      at(1, 1002, 1300, 0),                      // no answer (a silent connection)
      at(1, 1400, 1400, 201, "", true),          // a cached replay: a 2xx, not a new order
      at(0, 6000, 6001, 503, u),
      at(1, 7000, 7100, 503, u),                 // last 503
      at(1, 7050, 7200, 201),                    // first new order, replica 1
      at(0, 7150, 7300, 201),                    // replica 0
      at(0, 20000, 20001, 503, u),               // the next failover's
  };
  const std::vector<NemesisEvent> events{
      ev(1000, "start", "pg-failover", "primary a killed"),
      ev(7000, "promoted", "pg-failover", "b accepts writes after 6000 ms"),
      ev(15000, "heal", "pg-failover"),
      ev(16000, "start", "kill"),                // not a failover: ignored
      ev(19500, "start", "pg-switchover", "switchover from b"),
      ev(22000, "promoted", "pg-switchover"),
  };
  const auto f = failover_figures(history, events);
  REQUIRE(f.size() == 2);
  CHECK(f[0].kind == "pg-failover");
  CHECK(f[0].detail == "primary a killed");
  CHECK(f[0].promoted_us - f[0].start_us == 6'000'000);
  CHECK(f[0].healed_us == 15'000'000);
  CHECK(f[0].end_us == 19'500'000);
  CHECK(f[0].answers_503 == 3);
  CHECK(f[0].first_503_us == 1'005'000);
  CHECK(f[0].last_503_us == 7'100'000);
  CHECK(f[0].first_success_us == 1'400'000);
  CHECK(f[0].first_created_us == 7'200'000);
  CHECK(f[0].first_created_by_replica[1] == 7'200'000);
  CHECK(f[0].first_created_by_replica[0] == 7'300'000);
  CHECK(f[0].until_created.at("store_unavailable") == 3);
  CHECK(f[0].until_created.at("no_answer") == 1);
  CHECK(f[0].until_created.at("replayed") == 1);
  CHECK(f[1].answers_503 == 1);
  CHECK(f[1].first_created_us == -1);  // nothing recovered within the history
  CHECK(f[1].healed_us == -1);
  CHECK(offset_text(1'000'000, 7'100'000) == "+6.10 s");
  CHECK(offset_text(0, -1) == "-");
}

TEST_CASE("upgrade: the migrator's timed lines give each step's window") {
  const std::string out =
      "2026-12-03T07:32:06.262981Z 0003_fencing_tokens: started (compatible-from 2)\n"
      "2026-12-03T07:32:06.262983Z 0003_fencing_tokens step 1/5 started: transaction\n"
      "2026-12-03T07:32:06.263882Z 0003_fencing_tokens step 1/5 done in 0.001 s\n"
      "2026-12-03T07:32:06.263902Z 0003_fencing_tokens step 2/5 started: backfill idempotency_requests, 256 pages per batch\n"
      "2026-12-03T07:32:07.000000Z 0003_fencing_tokens step 2/5: sweep 1 done: 10 pages, 3 rows changed (3 in all)\n"
      "2026-12-03T07:32:08.500000Z 0003_fencing_tokens step 2/5 done in 2.236 s\n"
      "2026-12-03T07:32:09.000000Z 0006_trace_id step 1/2 started: transaction\n"
      "applied migration 3\n";
  const auto steps = parse_migrate_output(out);
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].name == "0003_fencing_tokens step 1/5");
  CHECK(steps[0].what == "transaction");
  CHECK(steps[0].end_us - steps[0].start_us == 899);
  CHECK(steps[1].what == "backfill idempotency_requests, 256 pages per batch");
  CHECK(steps[1].end_us - steps[1].start_us == 2'236'098);
  CHECK(steps[2].end_us == -1);  // never finished
  CHECK(parse_rfc3339_us("1970-01-01T00:00:01.000002Z") == 1'000'002);
  CHECK(parse_rfc3339_us("yesterday") == -1);
}
