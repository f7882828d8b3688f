// The gateway's pass over a request's header (gateway/inbound.hpp) and the loose route
// comparison (gateway/router.hpp), on values built by hand.
#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "gateway/headers.hpp"
#include "gateway/inbound.hpp"
#include "gateway/router.hpp"

namespace idem::gateway {
namespace {

using Fields = std::initializer_list<std::pair<const char*, const char*>>;

boost::beast::http::fields fields_of(Fields list) {
  boost::beast::http::fields f;
  for (const auto& [name, value] : list) f.insert(name, value);
  return f;
}

std::vector<std::string> names(const boost::beast::http::fields& f) {
  std::vector<std::string> out;
  for (const auto& field : f) out.emplace_back(field.name_string());
  return out;
}

const std::vector<std::string> kDecided = {"X-Tenant-Id", "X-User-Id", "Idempotency-Key",
                                           "X-Request-Mode"};

std::shared_ptr<const Runtime> runtime_with(std::vector<std::pair<std::string, std::string>> routes) {
  auto s = std::make_shared<settings::Settings>();
  s->tenant.principal_header = "X-User-Id";
  for (auto& [method, path] : routes) {
    settings::RouteSettings r;
    r.name = method + " " + path;
    r.method = method;
    r.path = path;
    r.scope = method + " " + path;
    r.fingerprint.headers = {"X-Request-Mode"};
    s->routes.push_back(std::move(r));
  }
  return Runtime::build(s);
}

}  // namespace

TEST_CASE("inbound: trusted headers and every look-alike of a decided header are removed") {
  auto f = fields_of({{"Host", "h"},
                      {"X-Idempotency-Operation-Id", "forged"},
                      {"x-idempotency-attempt", "9"},
                      {"X_Idempotency_Attempt", "9"},
                      {"X_IDEMPOTENCY_OPERATION_ID", "forged"},
                      {"X-Idempotency-Fencing-Token", "1"},
                      {"x_idempotency_fencing_token", "1"},
                      {"X-Tenant-Id", "me"},
                      {"X_Tenant_Id", "victim"},
                      {"x_tenant-id", "victim"},
                      {"X_User_Id", "admin"},
                      {"Idempotency_Key", "other"},
                      {"X_Request_Mode", "other"},
                      {"X_Custom_Header", "kept"}});
  const auto check = sanitize_inbound(f, kDecided);
  CHECK(check.ok);
  CHECK(check.dropped == 11);
  CHECK(names(f) == std::vector<std::string>{"Host", "X-Tenant-Id", "X_Custom_Header"});
  CHECK(f["X-Tenant-Id"] == "me");
}

TEST_CASE("inbound: a decided header spelled with underscores in the config keeps its own spelling") {
  auto f = fields_of({{"X_Tenant", "me"}, {"X-Tenant", "victim"}});
  const std::vector<std::string> decided = {"X_Tenant"};
  REQUIRE(sanitize_inbound(f, decided).ok);
  CHECK(names(f) == std::vector<std::string>{"X_Tenant"});
}

TEST_CASE("inbound: Connection may not remove a header idemproxy decides by") {
  for (const char* option : {"X-Tenant-Id", "x-tenant-id", "X_Tenant_Id", "X-User-Id",
                             "Idempotency-Key", "X-Request-Mode", "Host", "Content-Type"}) {
    CAPTURE(option);
    auto f = fields_of({{"Host", "h"}, {"Connection", "keep-alive"}, {"Connection", option}});
    const auto check = sanitize_inbound(f, kDecided);
    CHECK_FALSE(check.ok);
    CHECK(check.problem.find("Connection names") == 0);
  }
  auto ok = fields_of({{"Connection", "keep-alive, X-Debug, X-Idempotency-Attempt"}, {"X-Debug", "1"}});
  CHECK(sanitize_inbound(ok, kDecided).ok);
}

TEST_CASE("inbound: a second Content-Type is refused") {
  auto f = fields_of({{"Content-Type", "application/json"}, {"Content-Type", "text/plain"}});
  CHECK_FALSE(sanitize_inbound(f, kDecided).ok);
  auto one = fields_of({{"Content-Type", "application/json"}});
  CHECK(sanitize_inbound(one, kDecided).ok);
}

TEST_CASE("headers: the trusted list names every header forward() sets") {
  for (const auto name : {kOperationIdHeader, kAttemptHeader, kFencingTokenHeader}) {
    CHECK(std::find(kTrustedHeaders.begin(), kTrustedHeaders.end(), name) != kTrustedHeaders.end());
  }
  CHECK(same_name_for_cgi("X_Tenant_Id", "x-tenant-id"));
  CHECK_FALSE(same_name_for_cgi("X-Tenant-Idx", "X-Tenant-Id"));
}

TEST_CASE("headers: replay markers and hop-by-hop fields of every Connection field go") {
  auto f = fields_of({{"Idempotent-Replayed", "true"}, {"idempotent-replay-body", "omitted"},
                      {"Connection", "X-A"}, {"Connection", "X-B"}, {"X-A", "1"}, {"X-B", "2"},
                      {"Location", "/o/1"}});
  strip_replay_markers(f);
  strip_hop_by_hop(f);
  CHECK(names(f) == std::vector<std::string>{"Location"});
}

TEST_CASE("headers: a Location with bytes outside printable ASCII is a text resource id") {
  CHECK(resource_id_from_location("/orders/ord-1") == "/orders/ord-1");
  CHECK(resource_id_from_location("/orders/\xff\xfe x") == "/orders/%FF%FE%20x");
}

TEST_CASE("headers: a re-fetch never leaves the upstream: a path, or an absolute URL of the request's host") {
  const std::vector<std::string> none;
  CHECK(refetch_target("/orders/ord-1", "shop.example", none) == "/orders/ord-1");
  CHECK(refetch_target("/orders/ord-1?view=full#top", "shop.example", none) == "/orders/ord-1?view=full");
  // The request's own host, compared as an authority: case, default ports, an empty port.
  CHECK(refetch_target("https://shop.example/orders/1", "shop.example", none) == "/orders/1");
  CHECK(refetch_target("HTTP://Shop.Example:8080/a?b", "shop.example:8080", none) == "/a?b");
  CHECK(refetch_target("http://shop.example?x=1", "SHOP.example", none) == "/?x=1");
  CHECK(refetch_target("http://shop.example", "shop.example:80", none) == "/");
  CHECK(refetch_target("http://shop.example:/o", "shop.example", none) == "/o");
  CHECK(refetch_target("https://shop.example:443/o", "shop.example", none) == "/o");
  CHECK(refetch_target("http://[::1]:8080/o", "[::1]:8080", none) == "/o");
  // Another host, another port, user information, an encoded host: never followed.
  CHECK(refetch_target("http://other.example/orders/1", "shop.example", none).empty());
  CHECK(refetch_target("http://shop.example:8080/o", "shop.example", none).empty());
  CHECK(refetch_target("https://shop.example/o", "shop.example:80", none).empty());
  CHECK(refetch_target("http://shop.example@other.example/o", "shop.example", none).empty());
  CHECK(refetch_target("http://user@shop.example/o", "shop.example", none).empty());
  CHECK(refetch_target("http://shop%2Eexample/o", "shop%2Eexample", none).empty());
  CHECK(refetch_target("http://shop.example.evil/o", "shop.example", none).empty());
  CHECK(refetch_target("http://shop.example/o", "", none).empty());  // HTTP/1.0 without Host
  // ...unless the route lists it (replay.hosts, normalized by settings).
  const std::vector<std::string> listed{"api.example", "orders.example:8443"};
  CHECK(refetch_target("https://API.example/orders/1", "shop.example", listed) == "/orders/1");
  CHECK(refetch_target("https://orders.example:8443/o/2", "shop.example", listed) == "/o/2");
  CHECK(refetch_target("https://orders.example/o/2", "shop.example", listed).empty());
  // Not absolute http(s), not a path: nothing to fetch.
  CHECK(refetch_target("//shop.example/orders/1", "shop.example", none).empty());
  CHECK(refetch_target("orders/1", "shop.example", none).empty());
  CHECK(refetch_target("ftp://shop.example/x", "shop.example", none).empty());
  CHECK(refetch_target("", "shop.example", none).empty());
  CHECK(refetch_target("#frag", "shop.example", none).empty());
}

TEST_CASE("router: loose segments read a path as lenient backends do") {
  using V = std::vector<std::string>;
  CHECK(loose_segments("/orders") == V{"orders"});
  CHECK(loose_segments("//orders/") == V{"orders"});
  CHECK(loose_segments("/ORDERS") == V{"orders"});
  CHECK(loose_segments("/orders;jsessionid=1") == V{"orders"});
  CHECK(loose_segments("/orders.") == V{"orders"});
  CHECK(loose_segments("/orders%20") == V{"orders"});
  CHECK(loose_segments("/a%2Forders") == V{"a", "orders"});
  CHECK(loose_segments("/a%5Corders") == V{"a", "orders"});
  CHECK(loose_segments("/x/..%2Forders") == V{"orders"});
  CHECK(loose_segments("/") == V{});
  CHECK(loose_segments("/orders.json") == V{"orders.json"});
}

TEST_CASE("router: a target that misses a route only by a lenient reading resembles it") {
  auto rt = runtime_with({{"POST", "/orders"}, {"POST", "/tenants/{tid}/orders"}});
  for (const char* path : {"//orders", "/orders/", "/Orders", "/orders;x", "/orders.",
                           "/a/..%2Forders", "/tenants/t1//orders", "/tenants/t1/orders/",
                           "/TENANTS/t1/orders"}) {
    CAPTURE(path);
    CHECK(rt->match("POST", path) == nullptr);
    CHECK(rt->resembles("POST", path) != nullptr);
  }
  CHECK(rt->match("post", "/orders") == nullptr);
  CHECK(rt->resembles("post", "/orders") != nullptr);
  CHECK(rt->resembles("GET", "/orders/") == nullptr);
  CHECK(rt->resembles("POST", "/orders/1") == nullptr);
  CHECK(rt->resembles("POST", "/tenants//orders") == nullptr);  // no tenant at all
  CHECK(rt->resembles("POST", "/health") == nullptr);
}

TEST_CASE("router: the decided headers are the tenant, principal, key and fingerprint headers") {
  auto rt = runtime_with({{"POST", "/orders"}, {"PUT", "/orders/{id}"}});
  CHECK(rt->decided_headers() ==
        std::vector<std::string>{"X-Tenant-Id", "X-User-Id", "Idempotency-Key", "X-Request-Mode"});
}

}  // namespace idem::gateway

namespace idem::gateway {

TEST_CASE("inbound: a target that resembles a route is refused, others pass") {
  auto rt = runtime_with({{"POST", "/orders"}});
  auto f = fields_of({{"Host", "h"}});
  CHECK_FALSE(check_inbound(f, "POST", "/orders/", *rt, rt->match("POST", "/orders/")).ok);
  CHECK(check_inbound(f, "POST", "/orders", *rt, rt->match("POST", "/orders")).ok);
  CHECK(check_inbound(f, "GET", "/orders/", *rt, rt->match("GET", "/orders/")).ok);
}

TEST_CASE("inbound: a method override towards a route, or on a route's request, is refused") {
  auto rt = runtime_with({{"POST", "/orders"}, {"PUT", "/orders/{id}"}});
  auto to_put = [] { return fields_of({{"X-HTTP-Method-Override", "PUT"}}); };
  auto f = to_put();
  // POST /orders/1 matches no route, but a backend honouring the override runs PUT /orders/1.
  CHECK_FALSE(check_inbound(f, "POST", "/orders/1", *rt, nullptr).ok);
  auto g = fields_of({{"X_HTTP_Method", "put"}});
  CHECK_FALSE(check_inbound(g, "POST", "/orders/1/", *rt, nullptr).ok);
  // On the route's own request, an override to another method changes what runs.
  auto h = fields_of({{"X-Method-Override", "DELETE"}});
  CHECK_FALSE(check_inbound(h, "POST", "/orders", *rt, rt->match("POST", "/orders")).ok);
  // Naming the request's own method, or a method no route has on that path, is harmless.
  auto same = fields_of({{"X-HTTP-Method-Override", "POST"}});
  CHECK(check_inbound(same, "POST", "/orders", *rt, rt->match("POST", "/orders")).ok);
  auto other = fields_of({{"X-HTTP-Method-Override", "DELETE"}});
  CHECK(check_inbound(other, "POST", "/orders/1", *rt, nullptr).ok);
}

}  // namespace idem::gateway

namespace idem::gateway {

TEST_CASE("router: a route whose fingerprint or key cannot be compiled is a configuration error naming it") {
  auto s = std::make_shared<settings::Settings>();
  settings::RouteSettings r;
  r.name = "stripe";
  r.method = "POST";
  r.path = "/v1/charges";
  r.scope = "POST /v1/charges";
  r.source_line = 12;
  r.fingerprint.format = settings::BodyFormat::form;
  r.fingerprint.defaults["/qty"] = "1";  // a form holds strings: this default could never apply
  s->routes.push_back(r);
  try {
    Runtime::build(s);
    FAIL("a number default on a form route was accepted");
  } catch (const settings::ConfigError& e) {
    CHECK(e.key() == "routes[0].fingerprint");
    CHECK(e.line() == 12);
    CHECK(std::string(e.what()).find("strings only") != std::string::npos);
  }
  s->routes[0].fingerprint.defaults["/qty"] = "\"1\"";
  CHECK_NOTHROW(Runtime::build(s));
}

}  // namespace idem::gateway
