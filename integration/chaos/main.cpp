// idem_chaos — the randomized fault-injection run (docs/reliability.md). scripts/chaos
// builds it, starts a throwaway PostgreSQL and runs it; scripts/test runs a short one.
//
// Needs DATABASE_URL (a server it may create a database on) and IDEM_TEST_PGCTL (the
// control script of scripts/lib/pg-up, to restart that server). Exit status: 0 when every
// invariant held, 1 on a violation, 2 on a usage or setup error.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <atomic>
#include <thread>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "checker.hpp"
#include "client.hpp"
#include "cluster.hpp"
#include "failover_report.hpp"
#include "faults.hpp"
#include "history.hpp"
#include "nemesis.hpp"
#include "topology.hpp"
#include "upgrade.hpp"
#include "workload.hpp"

namespace {

using namespace idem::chaos;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace json = boost::json;

constexpr const char* kUsage = R"(usage: idem_chaos [options]
  --ops N          client operations (entries) to run (default 2000)
  --seed S         seed of every choice: workload, forms, replicas, faults (default: random)
  --faults LIST    comma-separated fault kinds or groups (default all; see below)
  --clients N      concurrent clients (default 8)
  --out DIR        where history, logs, rows and summary go (default chaos-<seed> in
                   $IDEM_TEST_TMPDIR if set, else in the current directory)
  --keep           keep the logs and the history also when every invariant held
  --lease D        the route's lease (default 1000ms); pauses last longer than it
  --response-timeout D   the sidecar's upstream response timeout (default 1000ms)
  --failover N     the store is a pg_auto_failover cluster (scripts/lib/paf-up); the run
                   ends after N failover steps (and the entries under way settle); faults
                   default to "failover"; --ops defaults to 200000 (an upper bound)
fault kinds: kill pause pg-restart-fast pg-restart-immediate backend-kill backend-pause
  backend-slow backend-503-before backend-503-after net-delay net-blackhole net-reset
  net-refuse; groups: all none process pg backend net; combo adds combinations
  with --failover only: pg-failover pg-failover-vanish pg-switchover (group failover),
  combinable with the process and backend kinds
  --upgrade-from BIN --upgrade-to BIN
                   a rolling upgrade (scripts/upgrade-check): the replicas start on the
                   first release, then the second migrates and replaces them one at a
                   time; faults default to none, --ops to 1000000 (an upper bound: the
                   load ends after the roll)
  --from-label T --to-label T   the releases' names in the report
  --prefill N      records written at the old schema before the load (upgrade runs)
  --expect-incompatible   the new release's migration allows no old replica: they must
                   turn unready (schema_incompatible) before the roll
  --readiness-may-drop    the old release predates the compatibility rule
environment: DATABASE_URL (required), IDEM_TEST_PGCTL (required with pg faults),
  IDEM_FAILOVER_NODES and IDEM_FAILOVER_CTL (with --failover; paf-up prints them),
  IDEMPROXY_BIN, IDEM_ORDER_BACKEND_BIN, IDEM_FAULT_PROXY_BIN (default: the build's)
exit status: 0 every invariant held, 1 violations (evidence kept in --out), 2 usage/setup
)";

// How long a run may go without any definite answer before it is declared stalled.
constexpr std::chrono::seconds kStallAfter{90};

struct Args {
  std::size_t ops = 2000;
  bool ops_given = false;
  std::uint64_t seed = 0;
  bool seed_given = false;
  FaultSet faults;
  bool faults_given = false;
  std::size_t failovers = 0;  // > 0: --failover
  std::size_t clients = 8;
  std::string out;
  bool keep = false;
  Millis lease{1000};
  Millis response_timeout{1000};
  // A rolling upgrade (upgrade.hpp) when both are set.
  std::string upgrade_from;
  std::string upgrade_to;
  std::string from_label = "old";
  std::string to_label = "new";
  std::uint64_t prefill = 0;
  bool expect_incompatible = false;
  bool readiness_may_drop = false;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t number(std::string_view name, std::string_view text, std::uint64_t max) {
  std::uint64_t v = 0;
  if (text.empty() || text.size() > 19) throw UsageError(std::string(name) + ": not a number");
  for (const char c : text) {
    if (c < '0' || c > '9') throw UsageError(std::string(name) + ": not a number");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v < 1 || v > max) {
    throw UsageError(std::string(name) + ": from 1 to " + std::to_string(max));
  }
  return v;
}

Millis duration(std::string_view name, std::string_view text) {
  std::uint64_t scale = 1;
  if (text.ends_with("ms")) {
    text.remove_suffix(2);
  } else if (text.ends_with("s")) {
    text.remove_suffix(1);
    scale = 1000;
  } else {
    throw UsageError(std::string(name) + ": a duration such as 800ms or 2s");
  }
  return Millis(number(name, text, 600'000) * scale);
}

// The failover kinds need the cluster; with it, the network and pg-restart kinds have no
// target (the links are per node, the nodes are the failover's).
void check_fault_mode(Args& a) {
  if (a.failovers == 0) {
    for (const auto k : a.faults.kinds) {
      if (is_failover(k)) throw UsageError(std::string(fault_name(k)) + " needs --failover N");
    }
    return;
  }
  if (!a.faults_given) a.faults = std::get<FaultSet>(parse_faults("failover"));
  if (!a.ops_given) a.ops = 200'000;
  bool any_failover = false;
  for (const auto k : a.faults.kinds) {
    any_failover = any_failover || is_failover(k);
    const auto target = std::string(fault_name(k));
    if (target.starts_with("net-") || target.starts_with("pg-restart")) {
      throw UsageError(target + " is not available with --failover (process, backend and "
                                "failover kinds are)");
    }
  }
  if (!any_failover) throw UsageError("--failover needs a failover kind in --faults");
}

Args parse(int argc, char** argv) {
  Args a;
  a.faults = std::get<FaultSet>(parse_faults("all"));
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--keep") {
      a.keep = true;
      continue;
    }
    if (arg == "--expect-incompatible" || arg == "--readiness-may-drop") {
      (arg == "--expect-incompatible" ? a.expect_incompatible : a.readiness_may_drop) = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError(std::string(arg) + " needs a value");
    const std::string_view value = argv[++i];
    if (arg == "--ops") {
      a.ops = number(arg, value, 100'000'000);
      a.ops_given = true;
    } else if (arg == "--failover") {
      a.failovers = number(arg, value, 1000);
    } else if (arg == "--seed") {
      a.seed = number(arg, value, ~std::uint64_t{0} / 10);
      a.seed_given = true;
    } else if (arg == "--faults") {
      auto parsed = parse_faults(value);
      if (auto* error = std::get_if<std::string>(&parsed)) throw UsageError("--faults: " + *error);
      a.faults = std::get<FaultSet>(parsed);
      a.faults_given = true;
    } else if (arg == "--clients") {
      a.clients = number(arg, value, 256);
    } else if (arg == "--out") {
      a.out = std::string(value);
    } else if (arg == "--lease") {
      a.lease = duration(arg, value);
    } else if (arg == "--response-timeout") {
      a.response_timeout = duration(arg, value);
    } else if (arg == "--upgrade-from") {
      a.upgrade_from = std::string(value);
    } else if (arg == "--upgrade-to") {
      a.upgrade_to = std::string(value);
    } else if (arg == "--from-label") {
      a.from_label = std::string(value);
    } else if (arg == "--to-label") {
      a.to_label = std::string(value);
    } else if (arg == "--prefill") {
      a.prefill = number(arg, value, 1'000'000'000);
    } else {
      throw UsageError("unknown option '" + std::string(arg) + "'");
    }
  }
  check_fault_mode(a);
  if (a.upgrade_from.empty() != a.upgrade_to.empty()) {
    throw UsageError("--upgrade-from and --upgrade-to go together");
  }
  if (!a.upgrade_to.empty()) {
    if (a.failovers > 0) throw UsageError("--upgrade-to and --failover do not combine");
    if (!a.faults_given) a.faults = std::get<FaultSet>(parse_faults("none"));
    // An upper bound: the load ends after the roll. A backfill of millions of rows takes
    // minutes, during which the clients run on.
    if (!a.ops_given) a.ops = 1'000'000;
  }
  if (!a.seed_given) {
    a.seed = (static_cast<std::uint64_t>(::getpid()) << 20) ^
             static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    a.seed = a.seed % 1'000'000'000 + 1;
  }
  if (a.out.empty()) {
    // Under scripts/test, with the other tests' temporary files; else here.
    const char* tmp = std::getenv("IDEM_TEST_TMPDIR");
    a.out = (tmp && *tmp ? std::string(tmp) + "/" : std::string()) + "chaos-" + std::to_string(a.seed);
  }
  return a;
}

// ------------------------------------------------------------------ rows and dumps

// The witness of every claim: a row per fencing token drawn by a claim, takeover or
// replacement, written by a trigger in the same transaction, so it is exactly as durable
// as the claim itself. Test instrumentation of the run's own database, installed after
// the replicas migrated it and before any traffic.
constexpr std::array<const char*, 3> kClaimWitnessSql{
    R"sql(
CREATE TABLE chaos_claims (
  tenant_id       text        NOT NULL,
  endpoint        text        NOT NULL,
  idempotency_key text        NOT NULL,
  fencing_token   bigint      NOT NULL,
  committed_at    timestamptz NOT NULL DEFAULT clock_timestamp()
))sql",
    R"sql(
CREATE FUNCTION chaos_witness_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO chaos_claims (tenant_id, endpoint, idempotency_key, fencing_token)
  VALUES (NEW.tenant_id, NEW.endpoint, NEW.idempotency_key, NEW.fencing_token);
  RETURN NULL;
END
$$)sql",
    R"sql(
CREATE TRIGGER chaos_witness_claim
  AFTER INSERT OR UPDATE OF fencing_token ON idempotency_requests
  FOR EACH ROW EXECUTE FUNCTION chaos_witness_claim())sql",
};

// orders and arrivals from the order API's database, records and claims from the store's
// (the same database unless the store is a cluster).
// The upgrade run's claim probes (tenant Upgrade::kProbeTenant) are its own evidence,
// not the plan's operations: left out here.
Snapshot snapshot(idem::it::Db& db, idem::it::Db& store, bool witnessed) {
  Snapshot s;
  const std::string probes = Upgrade::kProbeTenant;
  for (const auto& r : db.query(
           "SELECT order_id::text, tenant_id, customer_id, amount::text, checkout_id, "
           "coalesce(operation_id, retired_operation_id) FROM demo_orders.orders WHERE tenant_id <> $1",
           {probes})) {
    s.orders.push_back({r.at(0).value_or(""), r.at(1).value_or(""), r.at(2).value_or(""),
                        std::stoll(r.at(3).value_or("0")), r.at(4), r.at(5)});
  }
  for (const auto& r : db.query(
           "SELECT tenant_id, operation_id, attempt::text, fencing_token::text "
           "FROM demo_orders.arrivals WHERE tenant_id <> $1",
           {probes})) {
    ArrivalRow a{.tenant = r.at(0).value_or(""), .operation_id = r.at(1).value_or(""),
                 .attempt = std::stoll(r.at(2).value_or("0"))};
    if (r.at(3)) a.fencing_token = std::stoll(*r.at(3));
    s.arrivals.push_back(std::move(a));
  }
  if (witnessed) {
    for (const auto& r : store.query(
             "SELECT tenant_id, idemproxy_operation_id(tenant_id, endpoint, idempotency_key), "
             "fencing_token::text FROM chaos_claims")) {
      s.claims.push_back({r.at(0).value_or(""), r.at(1).value_or(""),
                          std::stoll(r.at(2).value_or("0"))});
    }
  }
  s.claims_witnessed = witnessed;
  for (const auto& r : store.query(
           "SELECT tenant_id, idempotency_key, state, response_status::text, "
           "convert_from(response_body, 'UTF8'), attempt_token::text "
           "FROM idempotency_requests WHERE endpoint = 'POST /orders' AND tenant_id <> $1",
           {probes})) {
    RecordRow row{.tenant = r.at(0).value_or(""), .key = r.at(1).value_or(""),
                  .state = r.at(2).value_or("")};
    if (r.at(3)) row.status = std::stoi(*r.at(3));
    row.body = r.at(4);
    row.attempt_token = std::stoll(r.at(5).value_or("0"));
    s.records.push_back(std::move(row));
  }
  return s;
}

// Every column of a table, one JSON object per row, as evidence.
void dump(idem::it::Db& db, const std::string& table, const fs::path& file) {
  const auto names = db.query(
      "SELECT column_name, data_type FROM information_schema.columns "
      "WHERE table_schema || '.' || table_name = $1 OR table_name = $1 ORDER BY ordinal_position",
      {table});
  std::string select;
  std::vector<std::string> columns;
  for (const auto& n : names) {
    const std::string col = n.at(0).value_or("");
    columns.push_back(col);
    if (!select.empty()) select += ", ";
    // bytea as text (bodies are JSON); everything else as PostgreSQL shows it.
    select += n.at(1) == "bytea" ? "convert_from(\"" + col + "\", 'UTF8')" : "\"" + col + "\"::text";
  }
  std::ofstream out(file);
  if (columns.empty()) return;
  for (const auto& row : db.query("SELECT " + select + " FROM " + table)) {
    json::object o;
    for (std::size_t i = 0; i < columns.size(); ++i) {
      o[columns[i]] = row.at(i) ? json::value(*row.at(i)) : json::value(nullptr);
    }
    out << json::serialize(o) << '\n';
  }
}

// ------------------------------------------------------------------------ summary

double sum_of(const MetricValues& m, std::string_view name) {
  double total = 0;
  for (const auto& [series, value] : m) {
    if (series == name || series.starts_with(std::string(name) + "{")) total += value;
  }
  return total;
}

// The label set of a series, e.g. outcome="created" -> created.
std::string label(const std::string& series, std::string_view key) {
  const std::string needle = std::string(key) + "=\"";
  const auto at = series.find(needle);
  if (at == std::string::npos) return "-";
  const auto end = series.find('"', at + needle.size());
  return series.substr(at + needle.size(), end - at - needle.size());
}

json::object by_label(const MetricValues& m, std::string_view name, std::string_view key) {
  json::object out;
  for (const auto& [series, value] : m) {
    if (!series.starts_with(std::string(name) + "{")) continue;
    const auto l = label(series, key);
    const double before = out.contains(l) ? out[l].as_double() : 0.0;
    out[l] = before + value;
  }
  return out;
}

// Numbers as people read them: whole ones without a fraction, others with one decimal.
std::string plain(const json::value& v) {
  if (v.is_string()) return std::string(v.get_string());
  if (!v.is_number()) return json::serialize(v);
  const double d = v.to_number<double>();
  char buf[64];
  if (d == static_cast<double>(static_cast<std::int64_t>(d))) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(d));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f", d);
  }
  return buf;
}

std::string text_of(const json::object& o) {
  std::string s;
  for (const auto& [k, v] : o) {
    if (v.is_number() && v.to_number<double>() == 0) continue;  // the zeros are in summary.json
    if (!s.empty()) s += ", ";
    s += std::string(k) + " " + plain(v);
  }
  return s.empty() ? "-" : s;
}

struct RunFigures {
  double load_seconds = 0;
  double quiet_seconds = 0;
  std::size_t nemesis_errors = 0;
  std::string stalled;  // why the run was stopped early, if it was
};

json::object failover_json(const FailoverFigures& f) {
  const auto ms = [&](std::int64_t at) -> json::value {
    if (at < 0) return nullptr;
    return static_cast<double>(at - f.start_us) / 1000.0;
  };
  json::object until;
  for (const auto& [k, n] : f.until_created) until[k] = n;
  return json::object{
      {"kind", f.kind},
      {"detail", f.detail},
      {"at_seconds", static_cast<double>(f.start_us) / 1e6},
      {"promoted_ms", ms(f.promoted_us)},
      {"first_503_ms", ms(f.first_503_us)},
      {"last_503_ms", ms(f.last_503_us)},
      {"answers_503", f.answers_503},
      {"first_success_ms", ms(f.first_success_us)},
      {"first_created_ms", ms(f.first_created_us)},
      {"first_created_ms_replica_0", ms(f.first_created_by_replica[0])},
      {"first_created_ms_replica_1", ms(f.first_created_by_replica[1])},
      {"rejoined_ms", ms(f.healed_us)},
      {"answers_until_first_created", std::move(until)},
  };
}

std::string failover_text(const FailoverFigures& f) {
  const auto at = [&](std::int64_t us) { return offset_text(f.start_us, us); };
  std::ostringstream out;
  out << "  " << f.kind << " at " << offset_text(0, f.start_us).substr(1) << " (" << f.detail
      << "): a node accepted writes " << at(f.promoted_us) << "; ";
  if (f.answers_503 == 0) {
    out << "no 503";
  } else {
    out << f.answers_503 << " answers 503 from " << at(f.first_503_us) << " to "
        << at(f.last_503_us);
  }
  out << "; first new order after that " << at(f.first_created_us) << " (replica 0 "
      << at(f.first_created_by_replica[0]) << ", replica 1 " << at(f.first_created_by_replica[1])
      << "), first 2xx " << at(f.first_success_us) << "; cluster whole again "
      << at(f.healed_us) << "\n";
  return out.str();
}

json::object summary_json(const Args& args, const CheckResult& r, const RunFigures& f,
                          const std::map<std::string, std::size_t>& faults,
                          const MetricValues& metrics, const Snapshot& rows,
                          const std::vector<FailoverFigures>& failovers) {
  json::object answers;
  for (std::size_t c = 0; c < kAnswerClasses; ++c) {
    answers[answer_class_name(static_cast<AnswerClass>(c))] = r.answers[c];
  }
  json::object fault_counts;
  std::size_t total_faults = 0;
  for (const auto& [k, n] : faults) {
    fault_counts[k] = n;
    total_faults += n;
  }
  json::object violations;
  for (const auto& [rule, n] : r.violations_by_rule) violations[rule] = n;
  std::size_t completed = 0;
  for (const auto& rec : rows.records) completed += rec.state == "completed" ? 1 : 0;
  const double ops_per_second = f.load_seconds > 0 ? static_cast<double>(r.entries) / f.load_seconds : 0;
  json::array failover_list;
  for (const auto& fo : failovers) failover_list.push_back(failover_json(fo));
  return json::object{
      {"seed", args.seed},
      {"ops", r.entries},
      {"clients", args.clients},
      {"faults_selected", describe(args.faults)},
      {"load_seconds", f.load_seconds},
      {"quiet_seconds", f.quiet_seconds},
      {"ops_per_second", ops_per_second},
      {"requests", r.requests},
      {"requests_per_second", f.load_seconds > 0 ? static_cast<double>(r.requests) / f.load_seconds : 0},
      {"max_attempts_of_one_operation", r.max_attempts},
      {"answers_by_class", std::move(answers)},
      {"faults_by_kind", std::move(fault_counts)},
      {"faults_total", total_faults},
      {"nemesis_errors", f.nemesis_errors},
      {"takeovers", sum_of(metrics, "idemproxy_takeovers_total")},
      {"fenced_writes", sum_of(metrics, "idemproxy_fenced_writes_total")},
      {"fenced_answers", by_label(metrics, "idemproxy_fenced_answers_total", "answer")},
      {"backend_arrivals", r.arrivals},
      {"backend_arrivals_with_fencing_token", r.arrivals_with_token},
      {"backend_arrivals_with_witnessed_claim", r.arrivals_with_claim},
      {"claims_witnessed", rows.claims.size()},
      {"failovers", std::move(failover_list)},
      {"replay_cache_active_at_end", sum_of(metrics, "idemproxy_replay_cache_active")},
      {"lease_renewals", sum_of(metrics, "idemproxy_lease_renewals_total")},
      {"sidecar_outcomes", by_label(metrics, "idemproxy_requests_total", "outcome")},
      {"store_errors", by_label(metrics, "idemproxy_store_errors_total", "kind")},
      {"operations", r.operations},
      {"orders", rows.orders.size()},
      {"orders_no_client_was_told_about", r.orders_without_result},
      {"records", rows.records.size()},
      {"records_completed", completed},
      {"violations", r.violations.size()},
      {"violations_by_rule", std::move(violations)},
  };
}

std::string summary_text(const json::object& s, const std::vector<FailoverFigures>& failovers) {
  const auto num = [&](std::string_view k) { return plain(s.at(k)); };
  std::ostringstream out;
  out << "idemproxy chaos run: seed " << num("seed") << ", " << num("ops") << " client operations, "
      << num("clients") << " clients, faults " << num("faults_selected") << "\n"
      << "  load " << num("load_seconds") << " s (" << num("ops_per_second") << " operations/s, "
      << num("requests") << " requests, " << num("requests_per_second")
      << " requests/s), the last open operations settled " << num("quiet_seconds")
      << " s after healing, at most " << num("max_attempts_of_one_operation")
      << " attempts for one operation\n"
      << "  answers by class: " << text_of(s.at("answers_by_class").as_object()) << "\n"
      << "  faults by kind (" << num("faults_total") << "): " << text_of(s.at("faults_by_kind").as_object())
      << "; nemesis errors " << num("nemesis_errors") << "\n"
      << "  sidecars: takeovers " << num("takeovers") << ", fenced writes " << num("fenced_writes")
      << " (fenced owners answered: " << text_of(s.at("fenced_answers").as_object())
      << "), lease renewals " << num("lease_renewals") << "\n"
      << "  backend: " << num("backend_arrivals") << " requests reached it ("
      << num("backend_arrivals_with_fencing_token") << " with a fencing token, "
      << num("backend_arrivals_with_witnessed_claim") << " of a claim the store holds; "
      << num("claims_witnessed") << " claims witnessed)\n"
      << "  sidecar outcomes: " << text_of(s.at("sidecar_outcomes").as_object()) << "\n"
      << "  store errors: " << text_of(s.at("store_errors").as_object()) << "\n"
      << "  rows: " << num("orders") << " orders for " << num("operations") << " operations ("
      << num("orders_no_client_was_told_about") << " that no client was told about), "
      << num("records") << " records, " << num("records_completed") << " completed\n";
  if (!failovers.empty()) {
    out << "  failovers (" << failovers.size() << "; times from each one's start):\n";
    for (const auto& f : failovers) out << failover_text(f);
  }
  if (s.at("violations").to_number<std::int64_t>() == 0) {
    out << "  every invariant held\n";
  } else {
    out << "  VIOLATIONS: " << num("violations") << " (" << text_of(s.at("violations_by_rule").as_object())
        << ")\n";
  }
  return out.str();
}

// ---------------------------------------------------------------------------- run

// The load and the quiet period: clients and nemesis run until every entry was handed
// out; then everything is healed and the open entries are retried until they settle. A
// run in which nothing settles for kStallAfter is stalled (a replica that cannot serve at
// all, say): it is stopped and reported, instead of retrying for hours.
//
// With --failover N the load ends instead when the nemesis has done its N failovers: the
// clients take no new entries, and the entries under way settle as above.
RunFigures drive(const Plan& plan, Clients& clients, Nemesis& nemesis, Topology& topology,
                 History& history, std::size_t failovers, const std::function<bool()>& load_done) {
  RunFigures figures;
  std::int64_t quiet_us = run_clock_us();
  const auto load_start = std::chrono::steady_clock::now();
  std::jthread nemesis_thread([&] { nemesis.run(); });
  std::atomic<bool> clients_done{false};
  std::jthread client_thread([&] {
    clients.run();
    clients_done.store(true);
  });

  auto last_report = std::chrono::steady_clock::now();
  const auto watch = [&](auto done) {
    while (!done()) {
      std::this_thread::sleep_for(100ms);  // progress reporting, not synchronization
      const auto since = std::max(clients.last_definite_us(), quiet_us);
      if (figures.stalled.empty() &&
          run_clock_us() - since > std::chrono::microseconds(kStallAfter).count()) {
        figures.stalled = "no operation got a definite answer for " +
                          std::to_string(kStallAfter.count()) + " s; " +
                          std::to_string(plan.entries.size() - clients.settled()) +
                          " entries unsettled";
        clients.abort();
      }
      if (std::chrono::steady_clock::now() - last_report > 10s) {
        last_report = std::chrono::steady_clock::now();
        std::cout << "chaos: " << clients.settled() << "/" << plan.entries.size() << " settled, "
                  << clients.requests() << " requests" << std::endl;
      }
    }
  };
  watch([&] {
    return clients.taken() >= plan.entries.size() || clients_done.load() ||
           (failovers > 0 && nemesis.failovers() >= failovers) || (load_done && load_done());
  });
  clients.drain();
  nemesis.stop();
  nemesis_thread.join();
  history.add(NemesisEvent{.at_us = run_clock_us(), .action = "quiet", .fault = "-", .detail = "healing"});
  topology.heal();
  const auto quiet_start = std::chrono::steady_clock::now();
  quiet_us = run_clock_us();
  history.add(NemesisEvent{.at_us = run_clock_us(), .action = "quiet", .fault = "-", .detail = "healed"});
  watch([&] { return clients_done.load(); });
  client_thread.join();
  const auto end = std::chrono::steady_clock::now();
  figures.load_seconds = std::chrono::duration<double>(end - load_start).count();
  figures.quiet_seconds = std::chrono::duration<double>(end - quiet_start).count();
  figures.nemesis_errors = nemesis.errors();
  history.flush();
  return figures;
}

// Summary (always), violations and rows (on failure or --keep), on screen and on disk.
void report(const Args& args, const fs::path& out, const CheckResult& result, const json::object& summary,
            const std::vector<FailoverFigures>& failovers, idem::it::Db& db, idem::it::Db& store) {
  const std::string text = summary_text(summary, failovers);
  std::ofstream(out / "summary.json") << json::serialize(summary) << '\n';
  std::ofstream(out / "summary.txt") << text;
  std::cout << text;
  const bool failed = !result.violations.empty();
  if (failed || args.keep) {
    dump(db, "demo_orders.orders", out / "orders.jsonl");
    dump(store, "idempotency_requests", out / "idempotency_requests.jsonl");
    if (store.scalar_int("SELECT count(*) FROM pg_class WHERE relname = 'chaos_claims'") > 0) {
      dump(store, "chaos_claims", out / "claims.jsonl");
    }
    dump(db, "demo_orders.arrivals", out / "arrivals.jsonl");
  }
  if (!failed) return;
  std::ofstream v(out / "violations.txt");
  for (const auto& violation : result.violations) v << violation.rule << ": " << violation.detail << "\n";
  std::cout << "first violations:\n";
  for (std::size_t i = 0; i < result.violations.size() && i < 15; ++i) {
    std::cout << "  " << result.violations[i].rule << ": " << result.violations[i].detail << "\n";
  }
  std::cout << "evidence (history.jsonl, violations.txt, rows, processes/*/ logs): " << out.string()
            << "\nreproduce the choices with --seed " << args.seed << std::endl;
}

int run(const Args& args) {
  const fs::path out = fs::absolute(args.out);
  fs::create_directories(out / "processes");
  // Every process log lands in the run's directory and stays there (support/process.hpp).
  ::setenv("IDEM_TEST_TMPDIR", (out / "processes").c_str(), 1);
  ::setenv("IDEM_TEST_KEEP_TMP", "1", 1);
  run_clock_us();  // the run's clock starts now

  const Plan plan = make_plan(args.seed, PlanOptions{.entries = args.ops});
  History history(out / "history.jsonl");
  std::cout << "chaos: seed " << args.seed << ", " << args.ops << " operations, faults "
            << describe(args.faults) << ", evidence in " << out.string() << std::endl;

  const std::string database = "chaos_" + std::to_string(args.seed) + "_" + std::to_string(::getpid());
  std::optional<Cluster> cluster;
  if (args.failovers > 0) {
    cluster.emplace(Cluster::from_environment());
    cluster->wait_healthy(60s);
    std::cout << "chaos: the store is a pg_auto_failover cluster (primary "
              << cluster->primary().value_or("?") << "); the order API's database is "
              << idem::it::database_url() << std::endl;
  }
  Topology topology(TopologyOptions{.server_url = idem::it::database_url(),
                                    .database = database,
                                    .lease = args.lease,
                                    .response_timeout = args.response_timeout,
                                    .cluster = cluster ? &*cluster : nullptr,
                                    .replica_binary = args.upgrade_from});
  MetricsTally tally;
  std::optional<Upgrade> upgrade;
  if (!args.upgrade_to.empty()) {
    upgrade.emplace(topology, UpgradeOptions{.new_binary = args.upgrade_to,
                                             .old_label = args.from_label,
                                             .new_label = args.to_label,
                                             .prefill = args.prefill,
                                             .expect_incompatible = args.expect_incompatible,
                                             .readiness_may_drop = args.readiness_may_drop,
                                             .out = out,
                                             .tally = &tally});
    upgrade->prefill();
  }
  // The replicas have migrated the store by now (migrate: auto, before they listen). A
  // release before fencing tokens (schema 2) has nothing to witness: the run checks
  // everything else.
  bool witnessed = false;
  {
    idem::it::Db store(topology.store_url());
    witnessed = store.scalar_int("SELECT count(*) FROM information_schema.columns WHERE"
                                 " table_name = 'idempotency_requests' AND column_name = 'fencing_token'") > 0;
    if (witnessed) {
      for (const char* sql : kClaimWitnessSql) store.exec(sql);
    }
  }
  Nemesis nemesis(topology, history,
                  Schedule(Rng::derive(args.seed, 0xfa17), args.faults,
                           FaultTimings{.lease = args.lease,
                                        .response_timeout = args.response_timeout,
                                        .client_timeout = ClientOptions{}.request_timeout}),
                  tally, args.failovers);
  Clients clients(plan, history, {topology.replica_port(0), topology.replica_port(1)},
                  ClientOptions{.seed = args.seed, .workers = args.clients});
  if (upgrade) upgrade->start();
  const RunFigures figures =
      drive(plan, clients, nemesis, topology, history, args.failovers,
            upgrade ? std::function<bool()>([&] { return upgrade->done(); }) : std::function<bool()>());
  if (upgrade) upgrade->stop();

  for (int r = 0; r < Topology::kReplicas; ++r) {
    if (auto values = topology.scrape(r)) tally.observe(r, *values);
  }
  bool failed = false;
  {
    idem::it::Db db(topology.database_url());
    idem::it::Db store(topology.store_url());
    const Snapshot rows = snapshot(db, store, witnessed);
    CheckResult result = check(plan, clients.taken(), history.attempts(), rows);
    if (!figures.stalled.empty()) {
      result.violations.insert(result.violations.begin(), Violation{"stalled", figures.stalled});
      ++result.violations_by_rule["stalled"];
    }
    const auto failovers = failover_figures(history.attempts(), history.events());
    report(args, out, result,
           summary_json(args, result, figures, nemesis.faults_by_kind(), tally.totals(), rows,
                        failovers),
           failovers, db, store);
    failed = !result.violations.empty();
    if (upgrade && !upgrade->report(db).ok) failed = true;
  }  // the run's databases are not in use past here: they can be dropped
  topology.stop();
  if (!failed && !args.keep) {
    fs::remove_all(out / "processes");
    fs::remove(out / "history.jsonl");
    idem::it::Db admin(idem::it::database_url());
    admin.exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
    if (cluster) {
      idem::it::Db(cluster->url("postgres")).exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "idem_chaos: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "idem_chaos: " << e.what() << std::endl;
    return 2;
  }
}
