#include "upgrade.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>

#include "support/http.hpp"
#include "support/process.hpp"

namespace idem::chaos {
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

std::int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double ms_between(std::int64_t a, std::int64_t b) { return static_cast<double>(b - a) / 1000.0; }

std::string fixed(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

Upgrade::Upgrade(Topology& topology, UpgradeOptions options)
    : topology_(topology), options_(std::move(options)) {}

Upgrade::~Upgrade() { stop(); }

// Completed records of another endpoint, with bodies of about 150 bytes, in batches of
// 100 000 rows each committed, as a table that has served for months would hold them.
// Only columns of schema 1: every release since can read them.
void Upgrade::prefill() {
  if (options_.prefill == 0) return;
  const auto started = std::chrono::steady_clock::now();
  it::Db db(topology_.store_url());
  constexpr std::uint64_t kBatch = 100'000;
  for (std::uint64_t from = 0; from < options_.prefill; from += kBatch) {
    const auto to = std::min(options_.prefill, from + kBatch);
    db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
            " state, attempt_token, lease_expires_at, response_status, response_headers, response_body,"
            " created_at, completed_at, expires_at)"
            " SELECT 'tenant-' || (g % 1000), 'POST /prefill', 'key-' || g, md5(g::text), 'completed', 1,"
            " NULL, 201, '[[\"Content-Type\",\"application/json\"]]'::jsonb,"
            " convert_to('{\"order_id\":\"' || md5(g::text) || '\",\"status\":\"created\",\"amount\":' ||"
            " (g % 10000) || ',\"items\":[{\"sku\":\"A1\",\"qty\":2}],\"customer_id\":\"c-' || g || '\"}', 'UTF8'),"
            " now() - interval '1 hour', now() - interval '1 hour', now() + interval '7 days'"
            " FROM generate_series($1::bigint, $2::bigint - 1) g",
            {static_cast<std::int64_t>(from), static_cast<std::int64_t>(to)});
  }
  db.exec("ANALYZE idempotency_requests");
  prefill_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "upgrade: " << options_.prefill << " records written in " << fixed(prefill_seconds_)
            << " s" << std::endl;
}

void Upgrade::start() {
  for (int r = 0; r < Topology::kReplicas; ++r) {
    threads_.emplace_back([this, r] { probe_loop(r); });
  }
  threads_.emplace_back([this] { sample_loop(); });
  threads_.emplace_back([this] {
    try {
      roll();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      roll_error_ = e.what();
    }
    done_ = true;
  });
}

void Upgrade::stop() {
  stop_ = true;
  threads_.clear();  // jthreads join
}

// A new key every 40 ms through one replica, unless that replica is being replaced (a
// pod out of the Service gets no traffic). Each probe's wait is the claim's stall: the
// backend answers at once.
void Upgrade::probe_loop(int replica) {
  std::unique_ptr<it::HttpClient> client;
  for (int n = 0; !stop_.load(); ++n) {
    std::this_thread::sleep_for(40ms);  // pacing, not synchronization
    if (replacing_[replica].load()) {
      client.reset();
      continue;
    }
    if (!client) client = std::make_unique<it::HttpClient>(topology_.replica_port(replica));
    Probe p;
    p.replica = replica;
    p.binary = upgraded_[replica].load() ? "new" : "old";
    const std::string id = std::to_string(replica) + "-" + std::to_string(n);
    const std::string body = R"({"customer_id":"probe-)" + id +
                             R"(","currency":"EUR","amount":1500,"items":[{"sku":"A1","qty":1}]})";
    p.sent_us = wall_us();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const auto res = client->post("/orders", body,
                                    {{"Content-Type", "application/json"},
                                     {"X-Tenant-Id", kProbeTenant},
                                     {"Idempotency-Key", "probe-" + id}},
                                    10s);
      p.status = res.status;
    } catch (const std::exception& e) {
      p.error = e.what();
      client.reset();
    }
    p.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // A probe that raced the replica's SIGTERM is the drain's, not a failure.
    if (replacing_[replica].load() && p.status != 201) continue;
    std::lock_guard lock(mutex_);
    probes_.push_back(std::move(p));
  }
}

void Upgrade::sample_loop() {
  std::unique_ptr<it::HttpClient> clients[Topology::kReplicas];
  while (!stop_.load()) {
    Sample s;
    s.at_us = wall_us();
    for (int r = 0; r < Topology::kReplicas; ++r) {
      try {
        if (!clients[r]) clients[r] = std::make_unique<it::HttpClient>(topology_.admin_port(r));
        const auto res = clients[r]->get("/readyz", {}, 2s);
        if (res.status == 200) {
          ++s.ready;
          s.reasons[r] = res.body.find("schema_newer_compatible") != std::string::npos
                             ? "ready (newer compatible schema)"
                             : "ready";
        } else {
          const auto at = res.body.find("\"reason\":\"");
          s.reasons[r] = at == std::string::npos
                             ? "status " + std::to_string(res.status)
                             : res.body.substr(at + 10, res.body.find('"', at + 10) - at - 10);
        }
      } catch (const std::exception&) {
        clients[r].reset();
        s.reasons[r] = "down";
      }
    }
    {
      std::lock_guard lock(mutex_);
      samples_.push_back(std::move(s));
    }
    std::this_thread::sleep_for(100ms);  // the sampling period
  }
}

void Upgrade::phase(std::string what, std::int64_t start_us) {
  std::lock_guard lock(mutex_);
  phases_.push_back({std::move(what), start_us, wall_us()});
  std::cout << "upgrade: " << phases_.back().what << " ("
            << fixed(ms_between(start_us, phases_.back().end_us) / 1000.0) << " s)" << std::endl;
}

// As deploy/kubernetes does it: the migrate Job, then one replica at a time.
void Upgrade::roll() {
  const auto idle = [&](std::chrono::seconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (!stop_.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  };
  idle(options_.warmup);
  const auto cfg = options_.out / "migrate.yaml";
  std::ofstream(cfg) << "listen: \"127.0.0.1:1\"\nupstream:\n  url: \"http://127.0.0.1:1\"\n"
                     << "database:\n  url: \"" << topology_.store_url() << "\"\n  migrate: check\n"
                     << "admin:\n  listen: \"\"\nroutes: []\n";
  auto t = wall_us();
  it::Process migrate(it::ProcessOptions{.executable = options_.new_binary,
                                         .args = {"migrate", "--config", cfg.string()},
                                         .name = "migrate"});
  const auto status = migrate.wait_exit(30min);
  {
    std::lock_guard lock(mutex_);
    migrate_output_ = migrate.log();
    migrate_status_ = status ? status->code() : -1;
    steps_ = parse_migrate_output(migrate_output_);
  }
  phase("migrate with the new release (exit " + std::to_string(migrate_status_) + ")", t);
  if (migrate_status_ != 0) throw std::runtime_error("migrate failed:\n" + migrate.log_tail());
  if (options_.expect_incompatible) {
    // The old replicas must see for themselves that they may not serve: wait for both to
    // say so (bounded), then roll.
    t = wall_us();
    const auto until = std::chrono::steady_clock::now() + 15s;
    bool both = false;
    while (!both && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(100ms);
      std::lock_guard lock(mutex_);
      if (!samples_.empty() && samples_.back().at_us > t) {
        both = samples_.back().reasons[0] == "schema_incompatible" &&
               samples_.back().reasons[1] == "schema_incompatible";
      }
    }
    phase(both ? "both old replicas turned unready: schema_incompatible"
               : "the old replicas did NOT both turn unready with schema_incompatible",
          t);
  }
  idle(1s);
  for (int r = 0; r < Topology::kReplicas && !stop_.load(); ++r) {
    t = wall_us();
    if (options_.tally) {
      if (auto values = topology_.scrape(r)) options_.tally->observe(r, *values);
      options_.tally->bank(r);
    }
    replacing_[r] = true;
    topology_.replace_replica(r, options_.new_binary, 60s);
    upgraded_[r] = true;
    replacing_[r] = false;
    // Ready again before the next one goes, as a readiness-gated roll waits.
    const auto until = std::chrono::steady_clock::now() + 30s;
    it::HttpClient admin(topology_.admin_port(r));
    while (std::chrono::steady_clock::now() < until) {
      try {
        if (admin.get("/readyz", {}, 2s).status == 200) break;
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(50ms);
    }
    phase("replica " + std::to_string(r) + " drained and started on the new release", t);
    idle(2s);
  }
  idle(options_.warmup);
}

json::object Upgrade::figures(std::vector<std::string>& failures, it::Db& orders_db) {
  std::lock_guard lock(mutex_);
  // Claim stalls by migration step: the probes sent while the step ran.
  json::array steps;
  double worst_during_migration = 0;
  for (const auto& s : steps_) {
    double worst = 0;
    std::size_t n = 0, failed = 0;
    for (const auto& p : probes_) {
      // Every claim that was waiting at some moment of the step: a step of a few
      // milliseconds still shows the claims it held up.
      const auto answered_us = p.sent_us + static_cast<std::int64_t>(p.ms * 1000);
      if (answered_us < s.start_us || (s.end_us >= 0 && p.sent_us > s.end_us)) continue;
      ++n;
      worst = std::max(worst, p.ms);
      failed += p.status == 201 ? 0 : 1;
    }
    worst_during_migration = std::max(worst_during_migration, worst);
    steps.push_back(json::object{{"step", s.name},
                                 {"what", s.what},
                                 {"seconds", s.end_us < 0 ? -1.0 : ms_between(s.start_us, s.end_us) / 1000.0},
                                 {"claims", n},
                                 {"claims_failed", failed},
                                 {"longest_claim_ms", worst}});
    if (worst > static_cast<double>(options_.max_stall.count())) {
      failures.push_back("a claim waited " + fixed(worst) + " ms during " + s.name + " (" + s.what + ")");
    }
  }
  json::object probes_by_answer;
  double worst_overall = 0;
  std::size_t created = 0;
  for (const auto& p : probes_) {
    const std::string key = p.binary + " " + (p.status ? std::to_string(p.status) : "no answer");
    probes_by_answer[key] = (probes_by_answer.contains(key) ? probes_by_answer[key].as_int64() : 0) + 1;
    worst_overall = std::max(worst_overall, p.ms);
    if (p.status == 201) {
      ++created;
    } else if (failures.size() < 20) {
      failures.push_back("a claim through the " + p.binary + " replica " + std::to_string(p.replica) +
                         " answered " + (p.status ? std::to_string(p.status) : "nothing: " + p.error));
    }
  }
  if (worst_overall > static_cast<double>(options_.max_stall.count())) {
    failures.push_back("a claim waited " + fixed(worst_overall) + " ms during the upgrade");
  }
  // Readiness: how many replicas were ready at each sample.
  json::object ready_counts;
  json::object unready_reasons;
  std::size_t none_ready = 0;
  std::size_t newer_compatible = 0;  // a replica ready on a newer schema that allows it
  for (const auto& s : samples_) {
    const std::string k = std::to_string(s.ready);
    ready_counts[k] = (ready_counts.contains(k) ? ready_counts[k].as_int64() : 0) + 1;
    none_ready += s.ready == 0 ? 1 : 0;
    for (const auto& reason : s.reasons) {
      newer_compatible += reason == "ready (newer compatible schema)" ? 1 : 0;
      if (reason.starts_with("ready")) continue;
      unready_reasons[reason] = (unready_reasons.contains(reason) ? unready_reasons[reason].as_int64() : 0) + 1;
    }
  }
  if (none_ready > 0 && !options_.readiness_may_drop && !options_.expect_incompatible) {
    failures.push_back(std::to_string(none_ready) + " readiness samples found no replica ready");
  }
  if (options_.expect_incompatible && !unready_reasons.contains("schema_incompatible")) {
    failures.push_back("no old replica reported schema_incompatible after the incompatible migration");
  }
  // One order per probe key, whatever replica and release answered it.
  const auto dup = orders_db.scalar_int(
      "SELECT count(*) FROM (SELECT customer_id FROM demo_orders.orders WHERE tenant_id = $1"
      " GROUP BY customer_id HAVING count(*) > 1) d",
      {std::string(kProbeTenant)});
  if (dup > 0) failures.push_back(std::to_string(dup) + " probe keys made more than one order");
  if (migrate_status_ != 0) failures.push_back("migrate exited " + std::to_string(migrate_status_));
  for (int r = 0; r < Topology::kReplicas; ++r) {
    if (!upgraded_[r].load()) {
      failures.push_back("replica " + std::to_string(r) + " was never replaced: the load ended before the roll "
                         "did (raise --ops)");
    }
  }
  if (!roll_error_.empty()) failures.push_back("the roll failed: " + roll_error_);
  json::array phases;
  for (const auto& p : phases_) {
    phases.push_back(json::object{{"what", p.what}, {"seconds", ms_between(p.start_us, p.end_us) / 1000.0}});
  }
  return json::object{
      {"from", options_.old_label},
      {"to", options_.new_label},
      {"records_prefilled", options_.prefill},
      {"prefill_seconds", prefill_seconds_},
      {"phases", std::move(phases)},
      {"migration_steps", std::move(steps)},
      {"longest_claim_ms_during_migration", worst_during_migration},
      {"longest_claim_ms", worst_overall},
      {"claims", probes_.size()},
      {"claims_created", created},
      {"claims_by_release_and_status", std::move(probes_by_answer)},
      {"readiness_samples", samples_.size()},
      {"readiness_samples_by_ready_replicas", std::move(ready_counts)},
      {"readiness_samples_with_no_replica_ready", none_ready},
      {"unready_reasons", std::move(unready_reasons)},
      {"replica_samples_ready_on_newer_compatible_schema", newer_compatible},
      {"readiness_may_drop", options_.readiness_may_drop},
      {"expect_incompatible", options_.expect_incompatible},
      {"probe_keys_with_two_orders", dup},
  };
}

Upgrade::Verdict Upgrade::report(it::Db& orders_db) {
  Verdict v;
  auto f = figures(v.failures, orders_db);
  v.ok = v.failures.empty();
  f["failures"] = [&] {
    json::array a;
    for (const auto& s : v.failures) a.push_back(json::value(s));
    return a;
  }();
  std::ostringstream text;
  text << "upgrade " << options_.old_label << " -> " << options_.new_label << ", "
       << options_.prefill << " records prefilled\n";
  for (const auto& p : f.at("phases").as_array()) {
    text << "  " << p.at("what").as_string().c_str() << ": " << fixed(p.at("seconds").to_number<double>(), 2)
         << " s\n";
  }
  text << "  migration steps (claims waiting at some moment of the step, and the longest wait):\n";
  for (const auto& s : f.at("migration_steps").as_array()) {
    text << "    " << s.at("step").as_string().c_str() << " (" << s.at("what").as_string().c_str()
         << "): " << fixed(s.at("seconds").to_number<double>(), 3) << " s, " << s.at("claims").as_uint64()
         << " claims, longest " << fixed(s.at("longest_claim_ms").to_number<double>()) << " ms\n";
  }
  text << "  claims: " << f.at("claims").as_uint64() << ", longest " << fixed(f.at("longest_claim_ms").to_number<double>())
       << " ms; by release and status: " << json::serialize(f.at("claims_by_release_and_status")) << "\n"
       << "  readiness: " << f.at("readiness_samples").as_uint64() << " samples, by replicas ready "
       << json::serialize(f.at("readiness_samples_by_ready_replicas")) << "; unready reasons "
       << json::serialize(f.at("unready_reasons")) << "; a replica ready on a newer compatible schema in "
       << f.at("replica_samples_ready_on_newer_compatible_schema").as_uint64() << " replica samples\n";
  if (options_.readiness_may_drop) {
    text << "  (the old release predates the compatibility rule: its readiness may drop once the new "
            "release migrates; counted, not a failure)\n";
  }
  text << (v.ok ? "  upgrade: every check held\n" : "  UPGRADE FAILED:\n");
  for (const auto& s : v.failures) text << "    " << s << "\n";
  std::ofstream(options_.out / "upgrade.json") << json::serialize(f) << '\n';
  std::ofstream(options_.out / "upgrade.txt") << text.str();
  std::ofstream(options_.out / "migrate.log") << migrate_output_;
  std::cout << text.str();
  return v;
}

}  // namespace idem::chaos
