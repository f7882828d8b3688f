// idem_chaos — the randomized fault-injection run (docs/reliability.md). scripts/chaos
// builds it, starts a throwaway PostgreSQL and runs it; scripts/test runs a short one.
//
// Needs DATABASE_URL (a server it may create a database on) and IDEM_TEST_PGCTL (the
// control script of scripts/lib/pg-up, to restart that server). Exit status: 0 when every
// invariant held, 1 on a violation, 2 on a usage or setup error.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "faults.hpp"
#include "history.hpp"
#include "nemesis.hpp"
#include "topology.hpp"
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
fault kinds: kill pause pg-restart-fast pg-restart-immediate backend-kill backend-pause
  backend-slow backend-503-before backend-503-after net-delay net-blackhole net-reset
  net-refuse; groups: all none process pg backend net; combo adds combinations
environment: DATABASE_URL (required), IDEM_TEST_PGCTL (required with pg faults),
  IDEMPROXY_BIN, IDEM_ORDER_BACKEND_BIN, IDEM_FAULT_PROXY_BIN (default: the build's)
exit status: 0 every invariant held, 1 violations (evidence kept in --out), 2 usage/setup
)";

// How long a run may go without any definite answer before it is declared stalled.
constexpr std::chrono::seconds kStallAfter{90};

struct Args {
  std::size_t ops = 2000;
  std::uint64_t seed = 0;
  bool seed_given = false;
  FaultSet faults;
  std::size_t clients = 8;
  std::string out;
  bool keep = false;
  Millis lease{1000};
  Millis response_timeout{1000};
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
    if (i + 1 >= argc) throw UsageError(std::string(arg) + " needs a value");
    const std::string_view value = argv[++i];
    if (arg == "--ops") {
      a.ops = number(arg, value, 100'000'000);
    } else if (arg == "--seed") {
      a.seed = number(arg, value, ~std::uint64_t{0} / 10);
      a.seed_given = true;
    } else if (arg == "--faults") {
      auto parsed = parse_faults(value);
      if (auto* error = std::get_if<std::string>(&parsed)) throw UsageError("--faults: " + *error);
      a.faults = std::get<FaultSet>(parsed);
    } else if (arg == "--clients") {
      a.clients = number(arg, value, 256);
    } else if (arg == "--out") {
      a.out = std::string(value);
    } else if (arg == "--lease") {
      a.lease = duration(arg, value);
    } else if (arg == "--response-timeout") {
      a.response_timeout = duration(arg, value);
    } else {
      throw UsageError("unknown option '" + std::string(arg) + "'");
    }
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

Snapshot snapshot(idem::it::Db& db) {
  Snapshot s;
  for (const auto& r : db.query(
           "SELECT order_id::text, tenant_id, customer_id, amount::text, checkout_id, "
           "coalesce(operation_id, retired_operation_id) FROM demo_orders.orders")) {
    s.orders.push_back({r.at(0).value_or(""), r.at(1).value_or(""), r.at(2).value_or(""),
                        std::stoll(r.at(3).value_or("0")), r.at(4), r.at(5)});
  }
  for (const auto& r : db.query(
           "SELECT tenant_id, operation_id, attempt::text, fencing_token::text "
           "FROM demo_orders.arrivals")) {
    ArrivalRow a{.tenant = r.at(0).value_or(""), .operation_id = r.at(1).value_or(""),
                 .attempt = std::stoll(r.at(2).value_or("0"))};
    if (r.at(3)) a.fencing_token = std::stoll(*r.at(3));
    s.arrivals.push_back(std::move(a));
  }
  for (const auto& r : db.query(
           "SELECT tenant_id, idempotency_key, state, response_status::text, "
           "convert_from(response_body, 'UTF8'), attempt_token::text "
           "FROM idempotency_requests WHERE endpoint = 'POST /orders'")) {
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

json::object summary_json(const Args& args, const CheckResult& r, const RunFigures& f,
                          const std::map<std::string, std::size_t>& faults,
                          const MetricValues& metrics, const Snapshot& rows) {
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
  const double ops_per_second = f.load_seconds > 0 ? static_cast<double>(args.ops) / f.load_seconds : 0;
  return json::object{
      {"seed", args.seed},
      {"ops", args.ops},
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

std::string summary_text(const json::object& s) {
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
      << num("backend_arrivals_with_fencing_token") << " with a fencing token)\n"
      << "  sidecar outcomes: " << text_of(s.at("sidecar_outcomes").as_object()) << "\n"
      << "  store errors: " << text_of(s.at("store_errors").as_object()) << "\n"
      << "  rows: " << num("orders") << " orders for " << num("operations") << " operations ("
      << num("orders_no_client_was_told_about") << " that no client was told about), "
      << num("records") << " records, " << num("records_completed") << " completed\n";
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
RunFigures drive(const Plan& plan, Clients& clients, Nemesis& nemesis, Topology& topology,
                 History& history) {
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
  watch([&] { return clients.taken() >= plan.entries.size() || clients_done.load(); });
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
            idem::it::Db& db) {
  const std::string text = summary_text(summary);
  std::ofstream(out / "summary.json") << json::serialize(summary) << '\n';
  std::ofstream(out / "summary.txt") << text;
  std::cout << text;
  const bool failed = !result.violations.empty();
  if (failed || args.keep) {
    dump(db, "demo_orders.orders", out / "orders.jsonl");
    dump(db, "idempotency_requests", out / "idempotency_requests.jsonl");
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
  Topology topology(TopologyOptions{.server_url = idem::it::database_url(),
                                    .database = database,
                                    .lease = args.lease,
                                    .response_timeout = args.response_timeout});
  MetricsTally tally;
  Nemesis nemesis(topology, history,
                  Schedule(Rng::derive(args.seed, 0xfa17), args.faults,
                           FaultTimings{.lease = args.lease,
                                        .response_timeout = args.response_timeout,
                                        .client_timeout = ClientOptions{}.request_timeout}),
                  tally);
  Clients clients(plan, history, {topology.replica_port(0), topology.replica_port(1)},
                  ClientOptions{.seed = args.seed, .workers = args.clients});
  const RunFigures figures = drive(plan, clients, nemesis, topology, history);

  for (int r = 0; r < Topology::kReplicas; ++r) {
    if (auto values = topology.scrape(r)) tally.observe(r, *values);
  }
  bool failed = false;
  {
    idem::it::Db db(topology.database_url());
    const Snapshot rows = snapshot(db);
    CheckResult result = check(plan, plan.entries.size(), history.attempts(), rows);
    if (!figures.stalled.empty()) {
      result.violations.insert(result.violations.begin(), Violation{"stalled", figures.stalled});
      ++result.violations_by_rule["stalled"];
    }
    report(args, out, result,
           summary_json(args, result, figures, nemesis.faults_by_kind(), tally.totals(), rows), db);
    failed = !result.violations.empty();
  }  // the run's database is not in use past here: it can be dropped
  topology.stop();
  if (!failed && !args.keep) {
    fs::remove_all(out / "processes");
    fs::remove(out / "history.jsonl");
    idem::it::Db admin(idem::it::database_url());
    admin.exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
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
