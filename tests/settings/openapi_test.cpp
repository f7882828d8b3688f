// `idemproxy routes --openapi`: proposals from realistic documents, loaded back through the
// settings loader (what check-config runs) and compiled into the gateway's runtime, which
// must protect exactly the operations named.
#include <doctest/doctest.h>

#include "gateway/router.hpp"
#include "settings/openapi.hpp"
#include "settings/settings.hpp"

using namespace idem;

namespace {

const std::string kDir = IDEM_OPENAPI_DIR;

std::string propose(const std::string& file, settings::OpenApiOptions o = {}) {
  return settings::propose_routes(kDir + "/" + file, o);
}

// The proposal placed in a configuration, loaded as check-config loads it.
std::shared_ptr<const settings::Settings> load(const std::string& proposal) {
  const std::string config = "upstream: { url: \"http://127.0.0.1:3000\" }\n"
                             "database: { url: \"postgresql://db/orders\" }\n" + proposal;
  return settings::load_text(config, "proposal.yaml");
}

const settings::RouteSettings& route(const settings::Settings& s, std::string_view name) {
  for (const auto& r : s.routes) {
    if (r.name == name) return r;
  }
  FAIL("no route " << name);
  throw 0;
}

bool has(const std::string& text, std::string_view part) {
  const bool found = text.find(part) != std::string::npos;
  if (!found) MESSAGE(text);
  return found;
}

std::string refusal(const std::string& text, settings::OpenApiOptions o = {}) {
  try {
    settings::propose_routes_text(text, "bad.yaml", o);
  } catch (const settings::ConfigError& e) {
    return e.full_message();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("openapi: an order API's key header, body fields, defaults and response headers") {
  const auto text = propose("orders.yaml");
  const auto s = load(text);
  REQUIRE(s->routes.size() == 1);  // only createOrder declares the key
  const auto& r = route(*s, "createOrder");
  CHECK(r.method == "POST");
  CHECK(r.path == "/orders");
  CHECK(r.key.header == "Idempotency-Key");
  CHECK(r.key.required);
  CHECK(r.key.max_length == 64);
  CHECK(r.fingerprint.format == settings::BodyFormat::json);
  REQUIRE(r.fingerprint.fields);
  CHECK(*r.fingerprint.fields == std::vector<std::string>{"/customer_id", "/currency", "/amount", "/items", "/gift"});
  CHECK(r.fingerprint.defaults == std::map<std::string, std::string>{{"/currency", "\"EUR\""}, {"/gift", "false"}});
  CHECK(r.replay_headers == std::vector<std::string>{"Content-Type", "Location", "ETag"});
  // Each choice is written down beside it.
  CHECK(has(text, "# /id left out: readOnly in the schema"));
  CHECK(has(text, "# /trace_id left out: a trace or timing member"));
  CHECK(has(text, "# /client_sent_at left out: a trace or timing member"));
  CHECK(has(text, "# also documented, not replayed (add them if a retry must see them): X-Request-Id"));

  // Served: exactly the operation named is protected.
  const auto rt = gateway::Runtime::build(s);
  CHECK(rt->match("POST", "/orders") != nullptr);
  CHECK(rt->match("GET", "/orders") == nullptr);
  CHECK(rt->match("POST", "/orders/o-1/cancel") == nullptr);
}

TEST_CASE("openapi: --all-posts proposes every POST, the key header assumed and said so") {
  const auto text = propose("orders.yaml", {.all_posts = true});
  const auto s = load(text);
  REQUIRE(s->routes.size() == 2);
  const auto& cancel = route(*s, "cancelOrder");
  CHECK(cancel.path == "/orders/{order_id}/cancel");
  CHECK(cancel.key.header == "Idempotency-Key");
  CHECK(cancel.fingerprint.format == settings::BodyFormat::raw);
  CHECK(has(text, "# the document declares no idempotency-key header here"));
  CHECK(has(text, "# no request body is documented"));
  const auto rt = gateway::Runtime::build(s);
  CHECK(rt->match("POST", "/orders/o-1/cancel") != nullptr);
  CHECK(rt->match("GET", "/orders/o-1") == nullptr);
}

TEST_CASE("openapi: a Stripe-like JSON document with a form body and an optional key") {
  const auto text = propose("stripe_like.json");
  const auto s = load(text);
  REQUIRE(s->routes.size() == 1);
  const auto& r = route(*s, "PostCharges");
  CHECK(r.fingerprint.format == settings::BodyFormat::form);
  CHECK_FALSE(r.key.required);
  CHECK(r.key.max_length == 255);
  CHECK(*r.fingerprint.fields == std::vector<std::string>{"/amount", "/currency", "/customer", "/metadata", "/capture"});
  CHECK(r.fingerprint.defaults.at("/capture") == "true");
  CHECK(r.replay_headers == std::vector<std::string>{"Content-Type"});
  CHECK(has(text, "# the parameter is optional in the document: requests without it pass through unprotected"));
}

TEST_CASE("openapi: $refs to parameters, bodies, schemas (allOf) and responses; path parameters") {
  const auto text = propose("refs.yaml");
  const auto s = load(text);
  REQUIRE(s->routes.size() == 2);
  const auto& pay = route(*s, "post-accounts-account-id-payments");
  CHECK(pay.path == "/accounts/{account_id}/payments");
  CHECK(pay.key.header == "X-Idempotency-Key");
  CHECK(pay.key.max_length == 128);
  CHECK(*pay.fingerprint.fields == std::vector<std::string>{"/amount", "/currency", "/payee"});
  CHECK(pay.fingerprint.defaults.at("/currency") == "\"USD\"");
  CHECK(pay.replay_headers == std::vector<std::string>{"Content-Type", "Location"});
  CHECK(has(text, "# /request_id left out: a trace or timing member"));
  const auto& refund = route(*s, "createRefund");
  // A member name with '/' is escaped as JSON Pointer reads it.
  CHECK(*refund.fingerprint.fields == std::vector<std::string>{"/payment_id", "/reason~1code"});
  const auto rt = gateway::Runtime::build(s);
  CHECK(rt->match("POST", "/accounts/a-1/payments") != nullptr);
  CHECK(rt->match("POST", "/accounts/a-1/refunds") != nullptr);
  CHECK(rt->match("GET", "/accounts/a-1/payments") == nullptr);
}

TEST_CASE("openapi: unsupported documents are refused, naming the file, line and operation") {
  CHECK(has(refusal("swagger: \"2.0\"\ninfo: {title: t, version: 1}\npaths: {}\n"),
            "bad.yaml:1: swagger: Swagger 2.0 is not supported: convert the document to OpenAPI 3 first"));
  CHECK(has(refusal("openapi: 4.0.0\npaths: {}\n"), "OpenAPI 4.0.0 is not supported"));
  CHECK(has(refusal("{\"info\": {}}"), "no 'openapi' version"));
  const std::string head = "openapi: 3.0.3\ninfo: {title: t, version: 1}\npaths:\n  /orders:\n    post:\n";
  const std::string key = "      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]\n";
  CHECK(has(refusal(head + key + "      requestBody: {$ref: \"other.yaml#/components/requestBodies/Order\"}\n"),
            "paths./orders.post.requestBody: $ref 'other.yaml#/components/requestBodies/Order' points outside this document"));
  CHECK(has(refusal(head + key + "      requestBody: {$ref: \"#/components/requestBodies/Nope\"}\n"),
            "$ref '#/components/requestBodies/Nope' names nothing in this document"));
  CHECK(has(refusal(head + key + "      requestBody: {content: {application/json: {}}}\n"),
            "paths./orders.post.requestBody.content.application/json: the request body (application/json) has no schema"));
  CHECK(has(refusal(head + key + "      requestBody: {content: {multipart/form-data: {schema: {type: object}}}}\n"),
            "a multipart body cannot be fingerprinted"));
  CHECK(has(refusal("openapi: 3.0.0\npaths: {/a: {post: {parameters: [{$ref: \"#/x\"}]}}}\n"), "paths./a.post.parameters"));
  // A document with nothing to protect says how to get a proposal, and loads.
  const auto none = settings::propose_routes_text("openapi: 3.0.0\ninfo: {title: t, version: 1}\npaths: {}\n", "n.yaml");
  CHECK(has(none, "--all-posts proposes every POST"));
  CHECK(load(none)->routes.empty());
}
