// deploy/: the Grafana dashboard, the Prometheus alert rules, the Kubernetes example and the
// compose file, checked against a running sidecar. Every metric name and label value the
// dashboard and the rules select must be in /metrics of a sidecar that has served nothing
// yet (so no alert or panel waits for a first increment); the rules file must have the
// structure Prometheus loads; the example configurations must pass check-config and
// actually serve; and the Kubernetes timings must let a SIGTERM drain finish before the
// kubelet's SIGKILL.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

const std::filesystem::path kSource = IDEM_SOURCE_DIR;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "40s", "2s", "5m", "500ms" -> milliseconds; anything else fails the test.
long long duration_ms(const std::string& text) {
  static const std::regex re("^([0-9]+)(ms|s|m|h)$");
  std::smatch m;
  if (!std::regex_match(text, m, re)) fail("not a duration: '" + text + "'");
  const long long n = std::stoll(m[1]);
  const std::string unit = m[2];
  return unit == "ms" ? n : unit == "s" ? n * 1000 : unit == "m" ? n * 60'000 : n * 3'600'000;
}

// The brackets and quotes of a PromQL expression pair up (a cheap syntax check that
// catches an edit that broke the expression; promtool is not in Debian 12).
void check_balanced(const std::string& expr) {
  std::string stack;
  bool quoted = false;
  for (std::size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (quoted) {
      if (c == '\\') ++i;
      else if (c == '"') quoted = false;
      continue;
    }
    if (c == '"') quoted = true;
    else if (c == '(' || c == '[' || c == '{') stack += c;
    else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (stack.empty() || stack.back() != open) fail("unbalanced '" + std::string(1, c) + "' in: " + expr);
      stack.pop_back();
    }
  }
  if (quoted || !stack.empty()) fail("unclosed bracket or quote in: " + expr);
}

struct Use {
  std::string where;  // "rule IdempotencyStuckClaim", "panel 'Store errors by kind'"
  std::string expr;
};

// Every `idemproxy_*` selector of `u.expr` names an exported family (a histogram's _bucket,
// _sum or _count included), every label it matches on is a label of that family, and every
// value it requires (`=`, or an `=~` list of plain words) is a value a series has now.
// Grafana variables ($job) and the target labels Prometheus adds (job, instance) are not
// the sidecar's to export. Returns the family names used.
std::set<std::string> check_use(const Use& u, const Exposition& e) {
  INFO(u.where << ": " << u.expr);
  check_balanced(u.expr);
  static const std::regex selector(R"((idemproxy_[a-z_]+)(\{([^}]*)\})?)");
  static const std::regex matcher(R"re(\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?)re");
  static const std::regex words("^[a-z_]+(\\|[a-z_]+)*$");
  std::set<std::string> used;
  for (std::sregex_iterator it(u.expr.begin(), u.expr.end(), selector), end; it != end; ++it) {
    std::string name = (*it)[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (!e.has_family(family) && name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          e.has_family(name.substr(0, name.size() - s.size()))) {
        family = name.substr(0, name.size() - s.size());
        CHECK_MESSAGE(e.types.at(family) == "histogram", name << " is not a histogram's series");
      }
    }
    if (!e.has_family(family)) {
      FAIL_CHECK(u.where << " uses " << name << ", which /metrics does not export");
      continue;
    }
    used.insert(family);
    // The samples of this exact series name, for its labels and their values.
    std::vector<const Sample*> series;
    for (const auto& s : e.samples) {
      if (s.name == name) series.push_back(&s);
    }
    CHECK_MESSAGE(!series.empty(), name << " has no sample before any request");
    const std::string labels = (*it)[3];
    for (std::sregex_iterator m(labels.begin(), labels.end(), matcher); m != end; ++m) {
      const std::string label = (*m)[1], op = (*m)[2], value = (*m)[3];
      if (label == "job" || label == "instance") continue;
      const bool has_label = std::any_of(series.begin(), series.end(),
                                         [&](auto* s) { return s->labels.count(label) != 0; });
      CHECK_MESSAGE(has_label, name << " has no label " << label);
      if (value.find('$') != std::string::npos || (op != "=" && op != "=~")) continue;
      if (op == "=~" && !std::regex_match(value, words)) continue;
      std::stringstream alternatives(value);
      for (std::string v; std::getline(alternatives, v, '|');) {
        const bool present = std::any_of(series.begin(), series.end(), [&](auto* s) {
          auto l = s->labels.find(label);
          return l != s->labels.end() && l->second == v;
        });
        CHECK_MESSAGE(present, name << "{" << label << "=\"" << v << "\"} is not exported before any request");
      }
    }
  }
  CHECK_MESSAGE(!used.empty(), u.where << " uses no idemproxy metric");
  return used;
}

// The rules file as Prometheus loads it: groups with a unique name and rules; each rule an
// alert with a unique name, an expression, an optional `for`, a severity and the
// annotations on-call reads. Unknown keys are refused as Prometheus does.
std::vector<Use> alert_rules(const YAML::Node& root) {
  std::vector<Use> uses;
  REQUIRE(root.IsMap());
  REQUIRE(root.size() == 1);
  REQUIRE(root["groups"].IsSequence());
  std::set<std::string> groups, alerts;
  static const std::regex duration("^[0-9]+(ms|s|m|h|d|w|y)$");
  static const std::regex alert_name("^[A-Z][A-Za-z0-9]*$");
  for (const auto& g : root["groups"]) {
    REQUIRE(g.IsMap());
    for (const auto& kv : g) {
      const auto k = kv.first.as<std::string>();
      CHECK_MESSAGE((k == "name" || k == "rules" || k == "interval"), "unknown group key " << k);
    }
    CHECK(groups.insert(g["name"].as<std::string>()).second);
    REQUIRE(g["rules"].IsSequence());
    REQUIRE(g["rules"].size() > 0);
    for (const auto& r : g["rules"]) {
      REQUIRE(r.IsMap());
      for (const auto& kv : r) {
        const auto k = kv.first.as<std::string>();
        CHECK_MESSAGE((k == "alert" || k == "expr" || k == "for" || k == "labels" ||
                       k == "annotations" || k == "keep_firing_for"),
                      "unknown rule key " << k);
      }
      const auto name = r["alert"].as<std::string>();
      INFO("alert " << name);
      CHECK(std::regex_match(name, alert_name));
      CHECK(alerts.insert(name).second);
      REQUIRE(r["expr"].IsScalar());
      if (r["for"]) CHECK(std::regex_match(r["for"].as<std::string>(), duration));
      REQUIRE(r["labels"].IsMap());
      const auto severity = r["labels"]["severity"].as<std::string>();
      CHECK((severity == "warning" || severity == "critical"));
      REQUIRE(r["annotations"].IsMap());
      CHECK(!r["annotations"]["summary"].as<std::string>().empty());
      CHECK(!r["annotations"]["action"].as<std::string>().empty());
      uses.push_back({"rule " + name, r["expr"].as<std::string>()});
    }
  }
  return uses;
}

// Every query of every panel (rows included, for collapsed ones), with unique panel ids
// and a grid position, and the template variables' queries.
std::vector<Use> dashboard_queries(const boost::json::object& dash) {
  std::vector<Use> uses;
  CHECK(dash.at("uid").as_string() == "idemproxy");
  std::set<std::int64_t> ids;
  std::vector<const boost::json::object*> panels;
  for (const auto& p : dash.at("panels").as_array()) {
    panels.push_back(&p.as_object());
    if (const auto* inner = p.as_object().if_contains("panels")) {
      for (const auto& q : inner->as_array()) panels.push_back(&q.as_object());
    }
  }
  for (const auto* p : panels) {
    const std::string title(p->at("title").as_string());
    CHECK_MESSAGE(ids.insert(p->at("id").as_int64()).second, "panel id repeated: " << title);
    const auto& grid = p->at("gridPos").as_object();
    CHECK(grid.at("w").as_int64() > 0);
    CHECK(grid.at("x").as_int64() + grid.at("w").as_int64() <= 24);
    if (p->at("type").as_string() == "row") continue;
    const auto& targets = p->at("targets").as_array();
    CHECK_MESSAGE(!targets.empty(), "panel without a query: " << title);
    for (const auto& t : targets) {
      uses.push_back({"panel '" + title + "'", std::string(t.as_object().at("expr").as_string())});
    }
  }
  for (const auto& v : dash.at("templating").as_object().at("list").as_array()) {
    const auto& var = v.as_object();
    if (var.at("type").as_string() != "query") continue;
    uses.push_back({"variable " + std::string(var.at("name").as_string()),
                    std::string(var.at("query").as_object().at("query").as_string())});
  }
  return uses;
}

// The ConfigMap's idemproxy.yaml and the Deployment of the Kubernetes example.
struct KubeExample {
  std::string config;
  YAML::Node deployment;
  YAML::Node job;
};

KubeExample kube_example() {
  KubeExample k;
  for (const auto& doc : YAML::LoadAllFromFile((kSource / "deploy/kubernetes/idemproxy.yaml").string())) {
    const auto kind = doc["kind"].as<std::string>();
    if (kind == "ConfigMap") k.config = doc["data"]["idemproxy.yaml"].as<std::string>();
    if (kind == "Deployment") k.deployment = doc;
    if (kind == "Job") k.job = doc;
  }
  REQUIRE(!k.config.empty());
  REQUIRE(k.deployment);
  REQUIRE(k.job);
  return k;
}

YAML::Node container(const YAML::Node& deployment, const std::string& name) {
  for (const auto& c : deployment["spec"]["template"]["spec"]["containers"]) {
    if (c["name"].as<std::string>() == name) return c;
  }
  fail("the Deployment has no container " + name);
}

long long prestop_sleep_ms(const YAML::Node& c) {
  const auto cmd = c["lifecycle"]["preStop"]["exec"]["command"];
  REQUIRE(cmd.size() == 2);
  REQUIRE(cmd[0].as<std::string>() == "sleep");
  return std::stoll(cmd[1].as<std::string>()) * 1000;
}

// `text` with `from` replaced; it must occur exactly once.
std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at == std::string::npos || text.find(from, at + 1) != std::string::npos) {
    fail("expected exactly one '" + from + "' in the example configuration");
  }
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("ops: deploy/ dashboards and alert rules use only exported metrics") {
  // The Kubernetes example's own configuration runs here, on local ports, after the
  // migrate its Job would run: what it declares is what the panels and rules see.
  TestBackend backend;
  ScratchDatabase fresh;
  AdminPort admin;
  const auto port = free_port();
  const auto kube = kube_example();
  auto yaml = replace_once(kube.config, "\"0.0.0.0:8080\"", "\"127.0.0.1:" + std::to_string(port) + "\"");
  yaml = replace_once(yaml, "\"0.0.0.0:9901\"", "\"" + admin.listen() + "\"");
  yaml = replace_once(yaml, "\"http://127.0.0.1:3000\"", "\"" + backend.url() + "\"");
  TempDir dir("deploy");
  const auto path = dir.write_file("idemproxy.yaml", yaml);
  const EnvList env{{"DATABASE_URL", fresh.url()}};
  auto migrated = run_idemproxy({"migrate", "--config", path.string()}, env);
  REQUIRE_MESSAGE(migrated.status.code() == 0, migrated.output);
  SidecarLaunch launch;
  launch.env = env;
  Sidecar sidecar(yaml, port, launch);

  // Before any request: what a dashboard sees right after a deploy.
  const auto e = scrape(admin.port);
  // Outcome counters of the configured route and store errors are there, at 0.
  CHECK(e.get("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", "key_reused"}}) == 0);
  CHECK(e.get("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", "store_unavailable"}}) == 0);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "unavailable"}}) == 0);

  std::set<std::string> rule_metrics, panel_metrics;
  const auto rules = YAML::LoadFile((kSource / "deploy/prometheus/idemproxy-alerts.yaml").string());
  for (const auto& u : alert_rules(rules)) {
    for (const auto& f : check_use(u, e)) rule_metrics.insert(f);
  }
  const auto dash = boost::json::parse(read_text(kSource / "deploy/grafana/idemproxy-dashboard.json"));
  for (const auto& u : dashboard_queries(dash.as_object())) {
    for (const auto& f : check_use(u, e)) panel_metrics.insert(f);
  }
  // What the issue asks both to cover: stuck work, conflicts, store unavailability,
  // takeovers, fenced writes, latency.
  for (const std::string f : {"idemproxy_in_progress_oldest_seconds", "idemproxy_requests_total",
                        "idemproxy_store_errors_total", "idemproxy_takeovers_total",
                        "idemproxy_fenced_writes_total", "idemproxy_request_duration_seconds",
                        "idemproxy_store_duration_seconds"}) {
    CHECK_MESSAGE(rule_metrics.count(f) == 1, "no alert rule uses " << f);
    CHECK_MESSAGE(panel_metrics.count(f) == 1, "no dashboard panel uses " << f);
  }
  const auto rules_text = read_text(kSource / "deploy/prometheus/idemproxy-alerts.yaml");
  for (const std::string outcome : {"outcome=\"key_reused\"", "outcome=\"in_progress\"", "outcome=\"store_unavailable\""}) {
    CHECK_MESSAGE(rules_text.find(outcome) != std::string::npos, "no alert rule on " << outcome);
  }

  // The example serves: a protected request through it is created, its retry replayed.
  HttpClient client(port);
  const auto tenant = unique("tenant");
  const std::string body = R"({"customer_id":"c-1","amount":1000})";
  CHECK(client.post("/orders", body, order_headers(tenant, "k1")).status == 201);
  CHECK(client.post("/orders", body, order_headers(tenant, "k1")).header("Idempotent-Replayed") == "true");
}

TEST_CASE("ops: deploy/ Kubernetes and compose examples are consistent") {
  const auto kube = kube_example();
  const auto cfg = YAML::Load(kube.config);
  const auto drain = duration_ms(cfg["limits"]["drain_timeout"].as<std::string>());
  const auto response = duration_ms(cfg["upstream"]["response_timeout"].as<std::string>());
  const auto statement = duration_ms(cfg["database"]["statement_timeout"].as<std::string>());
  // The drain covers the longest request (docs/configuration.md, drain_timeout).
  CHECK(drain >= response + 2 * statement);

  const auto& pod = kube.deployment["spec"]["template"]["spec"];
  const auto sidecar = container(kube.deployment, "idemproxy");
  const auto app = container(kube.deployment, "app");
  const auto grace = pod["terminationGracePeriodSeconds"].as<long long>() * 1000;
  const auto pre = prestop_sleep_ms(sidecar);
  // SIGTERM comes after preStop; the kubelet kills at the grace period, counted from the
  // start of preStop. Leave a few seconds for the exit itself.
  CHECK(grace >= pre + drain + 3000);
  // The app outlives the sidecar's drain: the last forwarded requests still reach it.
  CHECK(prestop_sleep_ms(app) >= pre + drain);
  CHECK(grace >= prestop_sleep_ms(app) + 3000);

  // Probes go to the admin listener's port, on the paths it serves.
  const auto admin_listen = cfg["admin"]["listen"].as<std::string>();
  const auto admin_port = std::stoi(admin_listen.substr(admin_listen.rfind(':') + 1));
  std::map<std::string, int> ports;
  for (const auto& p : sidecar["ports"]) ports[p["name"].as<std::string>()] = p["containerPort"].as<int>();
  CHECK(ports.at("admin") == admin_port);
  const auto listen = cfg["listen"].as<std::string>();
  CHECK(ports.at("http") == std::stoi(listen.substr(listen.rfind(':') + 1)));
  const std::map<std::string, std::string> probes{
      {"startupProbe", "/healthz"}, {"livenessProbe", "/healthz"}, {"readinessProbe", "/readyz"}};
  for (const auto& [probe, probe_path] : probes) {
    INFO(probe);
    const auto get = sidecar[probe]["httpGet"];
    REQUIRE(get);
    CHECK(get["path"].as<std::string>() == probe_path);
    CHECK(get["port"].as<std::string>() == "admin");
  }
  // The upstream is the app container, in the pod.
  CHECK(cfg["upstream"]["url"].as<std::string>() ==
        "http://127.0.0.1:" + std::to_string(app["ports"][0]["containerPort"].as<int>()));
  // Sidecar and Job read the same mounted file.
  const auto job = kube.job["spec"]["template"]["spec"]["containers"][0];
  CHECK(job["args"][0].as<std::string>() == "migrate");
  CHECK(job["args"][2].as<std::string>() == sidecar["args"][2].as<std::string>());

  // compose: its configuration is valid, its drain fits in the stop grace period, and
  // every file it mounts from deploy/ exists.
  const auto compose_dir = kSource / "deploy/compose";
  const auto compose = YAML::LoadFile((compose_dir / "compose.yaml").string());
  const auto compose_cfg_path = compose_dir / "idemproxy.yaml";
  const auto compose_cfg = YAML::LoadFile(compose_cfg_path.string());
  auto checked = run_idemproxy({"check-config", "--config", compose_cfg_path.string()},
                               {{"DATABASE_URL", "postgresql://idemproxy@127.0.0.1:1/orders"}});
  CHECK_MESSAGE(checked.status.code() == 0, checked.output);
  const auto compose_drain = duration_ms(compose_cfg["limits"]["drain_timeout"].as<std::string>());
  CHECK(duration_ms(compose["services"]["idemproxy"]["stop_grace_period"].as<std::string>()) > compose_drain);
  CHECK(compose_drain >= duration_ms(compose_cfg["upstream"]["response_timeout"].as<std::string>()) +
                             2 * duration_ms(compose_cfg["database"]["statement_timeout"].as<std::string>()));
  for (const auto& service : compose["services"]) {
    for (const auto& v : service.second["volumes"]) {
      const auto spec = v.as<std::string>();
      const auto host = spec.substr(0, spec.find(':'));
      if (host.rfind(".", 0) != 0) continue;  // a named volume
      CHECK_MESSAGE(std::filesystem::exists(compose_dir / host), "compose mounts a missing file " << host);
    }
  }
  const auto prom = YAML::LoadFile((compose_dir / "prometheus.yml").string());
  CHECK(prom["rule_files"][0].as<std::string>() == "/etc/prometheus/idemproxy-alerts.yaml");

  // And the Kubernetes configuration itself is valid as written.
  TempDir dir("deploy");
  auto k = run_idemproxy({"check-config", "--config", dir.write_file("k.yaml", kube.config).string()},
                         {{"DATABASE_URL", "postgresql://idemproxy@127.0.0.1:1/orders"}});
  CHECK_MESSAGE(k.status.code() == 0, k.output);
}
