// integration/order_backend/openapi.yaml is true of the backend it describes: the document
// names exactly the operations the API's dispatch table serves, and every documented
// answer is one the real backend gives (on real PostgreSQL) — status, media type, body
// schema, response headers both ways — with the orders it leaves behind counted per
// tenant. A documented status that no request here produces fails the test unless it is
// listed, with the reason, in kNotProduced. And the routes `idemproxy routes --openapi`
// proposes from the document pass check-config and, served in front of the backend,
// protect exactly the operations that declare an idempotency-key header.
#include <cctype>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common.hpp"
#include "e2e_stack.hpp"
#include "order_api.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

#ifndef IDEM_SOURCE_DIR
#define IDEM_SOURCE_DIR "."
#endif

namespace {

namespace json = boost::json;

YAML::Node document() {
  return YAML::LoadFile(std::string(IDEM_SOURCE_DIR) + "/integration/order_backend/openapi.yaml");
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A node with its internal "$ref" (#/components/...) followed, as a reader of it would.
YAML::Node resolve(const YAML::Node& doc, YAML::Node node) {
  for (int depth = 0; node.IsMap() && node["$ref"] && depth < 16; ++depth) {
    const auto ref = node["$ref"].as<std::string>();
    REQUIRE(ref.rfind("#/", 0) == 0);
    YAML::Node at = YAML::Clone(doc);
    std::size_t from = 2;
    while (from <= ref.size()) {
      const auto to = std::min(ref.find('/', from), ref.size());
      at = at[ref.substr(from, to - from)];
      REQUIRE_MESSAGE(at.IsDefined(), "dangling $ref " << ref);
      from = to + 1;
    }
    node = at;
  }
  return node;
}

// "METHOD path" of every operation the document describes, with its node.
std::map<std::string, YAML::Node> documented_operations(const YAML::Node& doc) {
  std::map<std::string, YAML::Node> out;
  for (const auto& path : doc["paths"]) {
    for (const auto& op : path.second) {
      out.emplace(idem::text::uppercase(op.first.as<std::string>()) + " " + path.first.as<std::string>(), op.second);
    }
  }
  return out;
}

bool has_type(const YAML::Node& type, std::string_view name) {
  if (type.IsSequence()) {
    for (const auto& t : type) {
      if (t.as<std::string>() == name) return true;
    }
    return false;
  }
  return type.as<std::string>() == name;
}

// Where `v` breaks `schema` (type, required, properties, items, enum, allOf), or "".
std::string violation(const YAML::Node& doc, const YAML::Node& at, const json::value& v, const std::string& where) {
  const YAML::Node schema = resolve(doc, at);
  for (const auto& part : schema["allOf"]) {
    if (auto e = violation(doc, part, v, where); !e.empty()) return e;
  }
  if (const auto type = schema["type"]) {
    const bool ok = (v.is_object() && has_type(type, "object")) || (v.is_array() && has_type(type, "array")) ||
                    (v.is_string() && has_type(type, "string")) || (v.is_bool() && has_type(type, "boolean")) ||
                    (v.is_null() && has_type(type, "null")) ||
                    ((v.is_int64() || v.is_uint64()) && (has_type(type, "integer") || has_type(type, "number")));
    if (!ok) return where + ": " + json::serialize(v) + " is not of the documented type";
  }
  if (const auto values = schema["enum"]; values && v.is_string()) {
    bool listed = false;
    for (const auto& e : values) listed = listed || e.as<std::string>() == v.get_string();
    if (!listed) return where + ": " + json::serialize(v) + " is not in the documented enum";
  }
  if (v.is_object()) {
    for (const auto& name : schema["required"]) {
      if (!v.get_object().contains(name.as<std::string>())) {
        return where + ": required member " + name.as<std::string>() + " is missing";
      }
    }
    for (const auto& p : schema["properties"]) {
      if (const auto* m = v.get_object().if_contains(p.first.as<std::string>())) {
        if (auto e = violation(doc, p.second, *m, where + "/" + p.first.as<std::string>()); !e.empty()) return e;
      }
    }
  }
  if (v.is_array() && schema["items"]) {
    for (std::size_t i = 0; i < v.get_array().size(); ++i) {
      const auto at_i = where + "/" + std::to_string(i);
      if (auto e = violation(doc, schema["items"], v.get_array()[i], at_i); !e.empty()) return e;
    }
  }
  return "";
}

// The `default` a schema (through $ref and allOf) gives its member `member`, or "".
std::string schema_default(const YAML::Node& doc, const YAML::Node& at, const std::string& member) {
  const YAML::Node schema = resolve(doc, at);
  if (const auto properties = schema["properties"]; properties && properties[member]) {
    const YAML::Node property = resolve(doc, properties[member]);
    if (property["default"]) return property["default"].as<std::string>();
  }
  for (const auto& part : schema["allOf"]) {
    if (auto found = schema_default(doc, part, member); !found.empty()) return found;
  }
  return "";
}

// The members of `a` that `b` lacks, as "X, Y" ("" when none), so a failure names them.
std::string only_in(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::string out;
  for (const auto& x : a) {
    if (!b.contains(x)) out += (out.empty() ? "" : ", ") + x;
  }
  return out;
}

// Headers every HTTP answer may carry whatever a document says.
const std::set<std::string> kFraming = {"content-type", "content-length", "connection", "keep-alive", "date", "server"};

// Documented answers no request here can produce, and why.
const std::map<std::string, std::string> kNotProduced = {
    {"GET /orders/{order_id} 503", "needs the order database down; the suites share one PostgreSQL"},
    {"GET /orders/by-operation/{operation_id} 503", "needs the order database down; the suites share one PostgreSQL"},
};

struct Contract {
  YAML::Node doc = document();
  std::map<std::string, YAML::Node> operations = documented_operations(doc);
  BackendProcess api{"api", {}};
  Db db{database_url()};
  HttpClient client{api.port()};
  std::string tenant = unique("tenant");
  std::set<std::string> produced;  // "METHOD path status"

  std::int64_t orders() {
    return db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1", {tenant});
  }

  // The `default` the request body schema of `op` documents for `member` ("" if none).
  std::string request_default(const std::string& op, const std::string& member) {
    const auto content = operations.at(op)["requestBody"]["content"];
    return schema_default(doc, content.begin()->second["schema"], member);
  }

  // Sends the request to the operation `op` ("METHOD path"), checks the answer against the
  // document and the orders it made against `orders_made`, and returns it.
  HttpResponse call(const std::string& op, const std::string& target, const Headers& headers,
                    const std::string& body, int status, std::int64_t orders_made = 0);
};

HttpResponse Contract::call(const std::string& op, const std::string& target, const Headers& headers,
                            const std::string& body, int status, std::int64_t orders_made) {
  INFO(op << " as " << target << " expecting " << status);
  REQUIRE(operations.contains(op));
  const auto before = orders();
  const auto res = client.request(op.substr(0, op.find(' ')), target, headers, body);
  INFO("answered " << res.status << ": " << res.body);
  REQUIRE(res.status == status);
  CHECK(orders() - before == orders_made);
  produced.insert(op + " " + std::to_string(status));
  // What the API accepted, the document allows a client to send.
  const auto request_body = operations.at(op)["requestBody"]["content"]["application/json"];
  if (status / 100 == 2 && request_body && header_value(headers, "Content-Type") == "application/json") {
    CHECK(violation(doc, request_body["schema"], json::parse(body), "request") == "");
  }

  const YAML::Node answer = resolve(doc, operations.at(op)["responses"][std::to_string(status)]);
  REQUIRE_MESSAGE(answer.IsDefined(), "status " << status << " is not documented for " << op);
  const YAML::Node content = answer["content"];
  REQUIRE(content.size() == 1);
  const auto media = content.begin()->first.as<std::string>();
  const auto type = res.header("Content-Type").value_or("");
  CHECK(type.substr(0, type.find(';')) == media);
  boost::system::error_code ec;
  const json::value value = json::parse(res.body, ec);
  REQUIRE_FALSE(ec);
  CHECK(violation(doc, content.begin()->second["schema"], value, "body") == "");

  std::set<std::string> documented;
  for (const auto& h : answer["headers"]) {
    documented.insert(lower(h.first.as<std::string>()));
    if (h.second["required"] && h.second["required"].as<bool>()) {
      CHECK_MESSAGE(res.has_header(h.first.as<std::string>()), h.first);
    }
  }
  for (const auto& [name, v] : res.headers) {
    CHECK_MESSAGE((kFraming.contains(lower(name)) || documented.contains(lower(name))), "undocumented header " << name);
  }
  return res;
}

const std::string kOrderJson = R"({"customer_id":"c-42","amount":1000,"items":[{"sku":"A-1","qty":2}])";

std::string order_json(const std::string& checkout, const std::string& extra = "") {
  return kOrderJson + R"(,"checkout_id":")" + checkout + "\"" + extra + "}";
}

Headers json_headers(const std::string& tenant) {
  return {{"Content-Type", "application/json"}, {"X-Tenant-Id", tenant}, {"Idempotency-Key", unique("key")}};
}

// One path the create is served under, with an order in the encoding it documents.
struct CreatePath {
  std::string path;
  std::string media;
  // The order for `checkout` (with `amount`), with or without the currency the document
  // gives a default: the same bytes for the same arguments.
  std::function<std::string(const std::string& checkout, int amount, bool currency)> body;
};

std::string json_order(const std::string& checkout, int amount, bool currency, const std::string& head = "") {
  return "{" + head + R"("customer_id":"c-42",)" + (currency ? R"("currency":"EUR",)" : "") +
         R"("amount":)" + std::to_string(amount) + R"(,"items":[{"sku":"A-1","qty":2}],"checkout_id":")" +
         checkout + "\"}";
}

const std::vector<CreatePath>& create_paths() {
  static const std::vector<CreatePath> paths{
      {"/orders", "application/json",
       [](const std::string& chk, int amount, bool currency) { return json_order(chk, amount, currency); }},
      {"/v1/orders", "application/x-www-form-urlencoded",
       [](const std::string& chk, int amount, bool currency) {
         return std::string("customer_id=c-42&") + (currency ? "currency=EUR&" : "") +
                "amount=" + std::to_string(amount) + "&items[0][sku]=A-1&items[0][qty]=2&checkout_id=" + chk;
       }},
      // Square-style: the key is a member of the body, derived from the checkout so that
      // the same arguments give the same bytes.
      {"/v2/orders", "application/json",
       [](const std::string& chk, int amount, bool currency) {
         return json_order(chk, amount, currency, R"("idempotency_key":"sq-)" + chk + "\",");
       }},
  };
  return paths;
}

// The answers every create path documents.
void exercise_create(Contract& c, const CreatePath& create) {
  const std::string op = "POST " + create.path;
  const auto body = [&](const std::string& checkout, int amount) { return create.body(checkout, amount, true); };
  const auto& path = create.path;
  const auto& media = create.media;
  Headers h{{"Content-Type", media}, {"X-Tenant-Id", c.tenant}, {"Idempotency-Key", unique("key")}};
  const auto checkout = unique("chk");
  const auto made = c.call(op, path, h, body(checkout, 1000), 201, 1);
  // Location names the order just stored, of this tenant.
  const auto id = json_string(made, "order_id");
  CHECK(made.header("Location") == "/orders/" + id);
  CHECK(c.db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE order_id = $1::uuid AND tenant_id = $2 "
                        "AND checkout_id = $3", {id, c.tenant, checkout}) == 1);
  // A default the request schema documents is the one the API applies: routes --openapi
  // makes it a fingerprint default, so a request without the member is the same operation.
  const auto defaulted = c.call(op, path, h, create.body(unique("chk"), 1000, false), 201, 1);
  CHECK(json_string(defaulted, "currency") == c.request_default(op, "currency"));

  c.call(op, path, h, media == "application/x-www-form-urlencoded" ? "customer_id=%zz" : "{", 400);
  c.call(op, path, {{"Content-Type", media}}, body(unique("chk"), 1000), 401);
  CHECK(problem_code(c.call(op, path, h, body(checkout, 1000), 409)) == "checkout_already_ordered");
  c.call(op, path, {{"Content-Type", "text/plain"}, {"X-Tenant-Id", c.tenant}}, body(unique("chk"), 1000), 415);
  CHECK(problem_code(c.call(op, path, h, body(unique("chk"), 0), 422)) == "invalid_amount");
  // A failure before anything is written, as the database's absence answers.
  c.call("PUT /_faults", "/_faults", {{"Content-Type", "application/json"}}, R"({"fail_next":1})", 200);
  c.call(op, path, h, body(unique("chk"), 1000), 503);
}

}  // namespace

TEST_CASE("openapi.yaml: the document names exactly the operations the order API serves") {
  const auto doc = document();
  std::set<std::string> served, served_for_tests;
  for (const auto& op : idem::demo::OrderApi::operations()) {
    const auto name = std::string(op.method) + " " + std::string(op.path);
    served.insert(name);
    if (op.fault_injection_only) served_for_tests.insert(name);
  }
  std::set<std::string> documented, documented_for_tests;
  for (const auto& [name, node] : documented_operations(doc)) {
    documented.insert(name);
    if (node["x-fault-injection-only"] && node["x-fault-injection-only"].as<bool>()) documented_for_tests.insert(name);
  }
  CHECK_MESSAGE(only_in(served, documented) == "", "served, not documented: " << only_in(served, documented));
  CHECK_MESSAGE(only_in(documented, served) == "", "documented, not served: " << only_in(documented, served));
  CHECK(only_in(served_for_tests, documented_for_tests) == "");
  CHECK(only_in(documented_for_tests, served_for_tests) == "");

  // And a documented path answers any other method 405, naming the documented ones.
  BackendProcess api("api", {});
  HttpClient client(api.port());
  std::map<std::string, std::string> allowed;
  for (const auto& name : documented) {
    auto& a = allowed[name.substr(name.find(' ') + 1)];
    a += (a.empty() ? "" : ", ") + name.substr(0, name.find(' '));
  }
  for (const auto& [path, methods] : allowed) {
    std::string target = path;
    if (const auto brace = target.find('{'); brace != std::string::npos) {
      target.replace(brace, target.find('}') - brace + 1, "x");
    }
    const auto res = client.request("DELETE", target, {{"X-Tenant-Id", "t"}});
    INFO(path);
    CHECK(res.status == 405);
    CHECK(res.header("Allow") == methods);
  }
  CHECK(client.get("/orders/x/y").status == 404);
}

TEST_CASE("openapi.yaml: every documented answer is one the real order API gives") {
  Contract c;
  for (const auto& create : create_paths()) exercise_create(c, create);
  CHECK(problem_code(c.call("POST /orders", "/orders", json_headers(c.tenant),
                            order_json(unique("chk"), R"(,"coupon":"SPRING2020")"), 422)) == "coupon_expired");

  // Reading an order: its own tenant (and customer) only.
  const auto made = c.call("POST /orders", "/orders", json_headers(c.tenant), order_json(unique("chk")), 201, 1);
  const auto id = json_string(made, "order_id");
  const std::string at = "/orders/" + id;
  CHECK(c.call("GET /orders/{order_id}", at, {{"X-Tenant-Id", c.tenant}}, "", 200).body == made.body);
  c.call("GET /orders/{order_id}", at, {}, "", 401);
  c.call("GET /orders/{order_id}", at, {{"X-Tenant-Id", c.tenant}, {"X-Customer-Id", "someone-else"}}, "", 403);
  c.call("GET /orders/{order_id}", at, {{"X-Tenant-Id", unique("tenant")}}, "", 404);

  // The reconciliation lookup finds the order an operation made, answered as its create.
  const std::string operation = std::string(60, 'b') + "cafe";  // 64 lowercase hex digits
  auto forwarded = json_headers(c.tenant);
  forwarded.emplace_back("X-Idempotency-Operation-Id", operation);
  forwarded.emplace_back("X-Idempotency-Attempt", "1");
  const auto by_op = c.call("POST /orders", "/orders", forwarded, order_json(unique("chk")), 201, 1);
  const auto found = c.call("GET /orders/by-operation/{operation_id}", "/orders/by-operation/" + operation,
                            {{"X-Tenant-Id", c.tenant}}, "", 201);
  CHECK(found.body == by_op.body);
  CHECK(found.header("Location") == by_op.header("Location"));
  c.call("GET /orders/by-operation/{operation_id}", "/orders/by-operation/" + operation,
         {{"X-Tenant-Id", c.tenant}, {"X-Idempotency-Operation-Id", "not-hex"}}, "", 400);
  c.call("GET /orders/by-operation/{operation_id}", "/orders/by-operation/" + operation, {}, "", 401);
  c.call("GET /orders/by-operation/{operation_id}", "/orders/by-operation/" + std::string(64, 'a'),
         {{"X-Tenant-Id", c.tenant}}, "", 404);

  c.call("GET /healthz", "/healthz", {}, "", 200);
  // The switches: the three faults set above were each used by one create.
  CHECK(c.call("GET /_faults", "/_faults", {}, "", 200).body.find(R"("fail_next":0)") != std::string::npos);
  c.call("PUT /_faults", "/_faults", {{"Content-Type", "application/json"}}, "[1]", 400);

  for (const auto& [op, node] : c.operations) {
    for (const auto& status : node["responses"]) {
      const auto answer = op + " " + status.first.as<std::string>();
      CHECK_MESSAGE((c.produced.contains(answer) || kNotProduced.contains(answer)),
                    "documented but never produced: " << answer);
    }
  }
}

namespace {

// "METHOD path" of every operation that declares an idempotency-key header parameter: what
// `routes --openapi` (without --all-posts) must propose, by docs/configuration.md §7's rule.
std::set<std::string> declaring_a_key(const YAML::Node& doc) {
  std::set<std::string> out;
  for (const auto& [name, op] : documented_operations(doc)) {
    for (const auto& p : op["parameters"]) {
      const YAML::Node parameter = resolve(doc, p);
      if (parameter["in"].as<std::string>() == "header" &&
          lower(parameter["name"].as<std::string>()).find("idempotency") != std::string::npos) {
        out.insert(name);
      }
    }
  }
  return out;
}

// The sidecar of `proposal` in front of the order API: the test's own listener, upstream
// and database, and nothing of a route but what the proposal says.
struct Served {
  explicit Served(const std::string& proposal) {
    SidecarOptions o;
    o.port = free_port();
    o.upstream_url = api.url();
    o.routes.clear();
    yaml = sidecar_config(o);
    const auto at = yaml.find("routes: []\n");
    REQUIRE(at != std::string::npos);
    yaml.replace(at, std::string("routes: []\n").size(), proposal);
    const auto checked = run_idemproxy({"check-config", "--config", dir.write_file("proposal.yaml", yaml).string()});
    INFO(yaml << checked.output);
    REQUIRE(checked.status.code() == 0);
    sidecar = std::make_unique<Sidecar>(yaml, o.port);
  }

  BackendProcess api{"api", {"--record-arrivals"}};
  Db db{database_url()};
  TempDir dir{"openapi-served"};
  std::string yaml;
  std::unique_ptr<Sidecar> sidecar;
};

// What a tenant left: orders, what reached the API as an operation (its arrivals), records.
struct Left {
  std::int64_t orders, arrivals, records;
  bool operator==(const Left&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Left& l) {
  return os << "{orders " << l.orders << ", arrivals " << l.arrivals << ", records " << l.records << "}";
}
Left left(Db& db, const std::string& tenant) {
  return {db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1", {tenant}),
          db.scalar_int("SELECT count(*) FROM demo_orders.arrivals WHERE tenant_id = $1", {tenant}),
          count_rows(db, tenant)};
}

// A protected create: the retry (also without the defaulted currency) is the first answer
// replayed, the backend called once; the key with another amount is refused.
void check_protected(Served& s, const CreatePath& create) {
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const Headers h{{"Content-Type", create.media}, {"X-Tenant-Id", tenant}, {"Idempotency-Key", key}};
  const auto checkout = unique("chk");
  HttpClient client(s.sidecar->port());
  const auto first = client.post(create.path, create.body(checkout, 1000, true), h);
  REQUIRE(first.status == 201);
  CHECK(left(s.db, tenant) == Left{1, 1, 1});
  for (const bool currency : {true, false}) {
    const auto retry = client.post(create.path, create.body(checkout, 1000, currency), h);
    CHECK(retry.status == 201);
    CHECK(retry.header("Idempotent-Replayed") == "true");
    CHECK(retry.body == first.body);
    CHECK(retry.header("Location") == first.header("Location"));
  }
  const auto other = client.post(create.path, create.body(checkout, 2000, true), h);
  CHECK(other.status == 409);
  CHECK(problem_code(other) == "idempotency_key_reused");
  CHECK(left(s.db, tenant) == Left{1, 1, 1});
  const auto row = read_row(s.db, tenant, key, "POST " + create.path);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->status == 201);
}

// An operation the proposal does not name: forwarded as sent, every time, nothing recorded.
void check_passes_through(Served& s, const CreatePath& create) {
  const auto tenant = unique("tenant");
  const Headers h{{"Content-Type", create.media}, {"X-Tenant-Id", tenant}, {"Idempotency-Key", unique("key")}};
  const auto checkout = unique("chk");
  HttpClient client(s.sidecar->port());
  const auto first = client.post(create.path, create.body(checkout, 1000, true), h);
  CHECK(first.status == 201);
  // The same request again reaches the API, which (having no key) refuses the checkout.
  const auto again = client.post(create.path, create.body(checkout, 1000, true), h);
  CHECK(again.status == 409);
  CHECK(problem_code(again) == "checkout_already_ordered");
  CHECK_FALSE(again.has_header("Idempotent-Replayed"));
  CHECK(left(s.db, tenant) == Left{1, 0, 0});
  const auto read = client.get(first.header("Location").value_or("/"), {{"X-Tenant-Id", tenant}});
  CHECK(read.status == 200);
  CHECK(left(s.db, tenant) == Left{1, 0, 0});
}

}  // namespace

TEST_CASE("openapi.yaml: the routes proposed from it pass check-config and, served, protect exactly the operations named") {
  const auto doc = document();
  const auto proposed = run_idemproxy(
      {"routes", "--openapi", std::string(IDEM_SOURCE_DIR) + "/integration/order_backend/openapi.yaml"});
  INFO(proposed.output);
  REQUIRE(proposed.status.code() == 0);
  std::set<std::string> named;
  for (const auto& route : YAML::Load(proposed.output)["routes"]) {
    named.insert(route["method"].as<std::string>() + " " + route["path"].as<std::string>());
  }
  const auto declaring = declaring_a_key(doc);
  CHECK(only_in(named, declaring) == "");
  CHECK(only_in(declaring, named) == "");
  CHECK(named == std::set<std::string>{"POST /orders", "POST /v1/orders"});

  Served served(proposed.output);
  for (const auto& create : create_paths()) {
    INFO("POST " << create.path);
    if (named.contains("POST " + create.path)) {
      check_protected(served, create);
    } else {
      check_passes_through(served, create);
    }
  }
}
