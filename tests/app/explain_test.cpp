// `idemproxy explain` without a database: the account it prints of a request, from a real
// configuration text through the settings loader and the gateway's own admission
// (gateway::examine, whose agreement with handle() tests/gateway proves).
#include <doctest/doctest.h>

#include "app/explain.hpp"
#include "gateway/router.hpp"
#include "idempotency/fingerprint.hpp"
#include "settings/settings.hpp"

using namespace idem;

namespace {

constexpr const char* kConfig = R"(
upstream: { url: "http://127.0.0.1:3000" }
database: { url: "postgresql://db/orders" }
tenant: { principal_header: X-User-Id }
routes:
  - name: create-order
    method: POST
    path: /orders
    fingerprint:
      fields: [/customer_id, /amount, /currency]
      defaults: { /currency: "EUR" }
  - name: capture-payment
    method: POST
    path: /payments/{id}/capture
  - name: stripe-charge
    method: POST
    path: /v1/charges
    key: { required: false }
    fingerprint: { format: form }
)";

std::shared_ptr<const gateway::Runtime> runtime(const std::string& text = kConfig) {
  return gateway::Runtime::build(settings::load_text(text, "explain.yaml"));
}

app::ExplainOptions request(std::string method, std::string target, std::string key = "",
                            std::string body = "") {
  app::ExplainOptions o;
  o.method = std::move(method);
  o.target = std::move(target);
  o.tenant = "acme";
  if (!key.empty()) o.headers.emplace_back("Idempotency-Key", key);
  o.headers.emplace_back("Content-Type", "application/json");
  o.headers.emplace_back("X-User-Id", "user-secret-42");
  o.body = std::move(body);
  o.body_given = !o.body.empty();
  return o;
}

bool has(const std::string& text, std::string_view part) {
  const bool found = text.find(part) != std::string::npos;
  if (!found) MESSAGE(text);
  return found;
}

}  // namespace

TEST_CASE("explain: a match shows route, tenant, key, the hashed text and its hash, record and answer") {
  gateway::Examination e;
  const auto text = app::explain_text(runtime(), request("POST", "/orders", "order-0001",
                                                         R"({"amount":1e3,"customer_id":"c-42","trace":"x"})"),
                                      &e);
  REQUIRE(e.way == gateway::Examination::Way::protected_request);
  CHECK(has(text, "route:        create-order (POST /orders)"));
  CHECK(has(text, "scope:        POST /orders"));
  CHECK(has(text, "tenant:       acme (header X-Tenant-Id)"));
  CHECK(has(text, "key as read:  order-0001"));
  CHECK(has(text, "from header Idempotency-Key, required, at most 255 characters"));
  // The canonical text item by item, its JSON exactly as hashed (1e3 read as 1000, the
  // default filled in, the unselected member left out).
  CHECK(has(text, R"(  | 56:{"/amount":1000,"/currency":"EUR","/customer_id":"c-42"})"));
  CHECK(has(text, "  | 12:POST /orders\n"));
  CHECK(has(text, "  sha256:     " + idempotency::sha256_hex(e.canonical) + "\n"));
  CHECK(has(text, "operation id: " + idempotency::operation_id("acme", "POST /orders", "order-0001")));
  CHECK(has(text, "a new key:    claimed in PostgreSQL (in_progress, attempt 1, lease 30s)"));
  // The principal is shown as the hash the record keeps, never as the header's value.
  CHECK(has(text, "principal:    stored as hash " + e.principal.substr(0, 12)));
  CHECK(text.find("user-secret-42") == std::string::npos);
}

TEST_CASE("explain: a near miss names the nearest route and what differs") {
  const auto rt = runtime();
  auto text = app::explain_text(rt, request("POST", "/order", "k"));
  CHECK(has(text, "route:        none matches POST /order\n"));
  CHECK(has(text, "nearest:      create-order (POST /orders): the path differs (the route's is /orders)\n"));
  CHECK(has(text, "answer:       forwarded unchanged and unprotected (unmatched: pass): no key is claimed"));

  text = app::explain_text(rt, request("PUT", "/payments/p-1/capture", "k"));
  CHECK(has(text, "nearest:      capture-payment (POST /payments/{id}/capture): the method differs (the route's is POST)\n"));

  // With unmatched: reject the answer is the 404 the client gets.
  text = app::explain_text(runtime(std::string(kConfig) + "unmatched: reject\n"), request("POST", "/payment/p-1/capture", "k"));
  CHECK(has(text, "nearest:      capture-payment (POST /payments/{id}/capture): the path differs"));
  CHECK(has(text, "answer:       404 route_not_found (refused before anything is claimed or forwarded)"));
}

TEST_CASE("explain: a bad key gets the exact refusal the client would get") {
  const auto text = app::explain_text(runtime(), request("POST", "/orders", "two words", R"({"amount":1})"));
  CHECK(has(text, "route:        create-order (POST /orders)"));
  CHECK(has(text, "tenant:       acme"));
  CHECK(has(text, "answer:       400 idempotency_key_invalid (refused before anything is claimed or forwarded)\n"));
  CHECK(has(text, R"(  {"type":"urn:idemproxy:problem:idempotency_key_invalid","title":"Idempotency key invalid","status":400,"code":"idempotency_key_invalid","detail":)"));
  CHECK(text.find("a new key:") == std::string::npos);
}

TEST_CASE("explain: pass-throughs, a key-less optional route, and a request the listener refuses") {
  const auto rt = runtime();
  auto o = request("POST", "/v1/charges", "", "amount=1");
  o.headers.at(0).second = "application/x-www-form-urlencoded";
  auto text = app::explain_text(rt, o);
  CHECK(has(text, "route:        stripe-charge (POST /v1/charges)"));
  CHECK(has(text, "answer:       no key and key.required is false: forwarded unprotected, nothing claimed"));

  // The same route with a key: the form is what is fingerprinted.
  o.headers.emplace_back("Idempotency-Key", "ch-1");
  text = app::explain_text(rt, o);
  CHECK(has(text, "format form, whole body"));
  CHECK(has(text, R"(  | 14:{"amount":"1"})"));

  text = app::explain_text(rt, request("GET", "/orders/o-1"));
  CHECK(has(text, "answer:       forwarded unchanged and unprotected"));

  auto smuggled = request("POST", "/orders", "k", "{}");
  smuggled.headers.emplace_back("Host", "a");
  smuggled.headers.emplace_back("Host", "b");  // two Host fields: RFC 9112 §3.2
  text = app::explain_text(rt, smuggled);
  CHECK(has(text, "answer:       400 bad_request from the listener"));
}
