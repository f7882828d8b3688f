// Orders in the shapes real order APIs take them, through the whole stack (docs/http.md,
// docs/configuration.md §4.3, §4.4): a Stripe-style form, a Square-style key in the body,
// an AWS-style key in the query, a protobuf body on a raw route. Each is proven by the rows
// in PostgreSQL (orders, idempotency records) and by what the order API received (its
// arrivals), not by statuses alone.
#include "common.hpp"
#include "e2e_stack.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

namespace {

// A route of the stack on `path`, with the order route's fields and default.
RouteOptions shaped_route(std::string name, std::string path) {
  StackOptions defaults;
  defaults.lease = "1s";
  RouteOptions r = order_route(defaults);
  r.name = std::move(name);
  r.path = std::move(path);
  r.extra_yaml.clear();  // completion: sidecar
  return r;
}

StackOptions with_route(RouteOptions route) {
  StackOptions o;
  o.record_arrivals = true;  // every POST that reached the API, in demo_orders.arrivals
  o.extra_routes = {std::move(route)};
  return o;
}

std::int64_t arrivals(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM demo_orders.arrivals WHERE tenant_id = $1", {tenant});
}

std::string stored_items(Db& db, const std::string& tenant) {
  return db.scalar("SELECT items::text FROM demo_orders.orders WHERE tenant_id = $1", {tenant}).value_or("");
}

Headers form_headers(const std::string& tenant, const std::string& key) {
  Headers h{{"Content-Type", "application/x-www-form-urlencoded"}, {"X-Tenant-Id", tenant}};
  if (!key.empty()) h.emplace_back("Idempotency-Key", key);
  return h;
}

// protobuf wire format: a field's tag, a length-delimited value, a varint.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void bytes_field(std::string& out, unsigned field, std::string_view value) {
  varint(out, field << 3 | 2);
  varint(out, value.size());
  out += value;
}
void varint_field(std::string& out, unsigned field, std::uint64_t value) {
  varint(out, field << 3);
  varint(out, value);
}

// Order{customer_id, amount, items:[{sku, qty}], checkout_id} (order_request.hpp's message).
std::string protobuf_order(const std::string& checkout, std::uint64_t amount) {
  std::string item;
  bytes_field(item, 1, "A-1");
  varint_field(item, 2, 2);
  std::string order;
  bytes_field(order, 1, "c-42");
  varint_field(order, 3, amount);
  bytes_field(order, 4, item);
  bytes_field(order, 5, checkout);
  return order;
}

}  // namespace

TEST_CASE("e2e: a Stripe-style form create replays byte for byte; re-encoded and reordered it is the same request; a changed value is 409") {
  auto route = shaped_route("create-order-form", "/v1/orders");
  route.fingerprint_format = "form";
  OrderStack stack(with_route(route));
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto checkout = unique("chk");
  auto client = stack.client();

  const std::string form = "customer_id=c+42&amount=1000&items[0][sku]=A-1&items[0][qty]=2"
                           "&items[1][sku]=B-2&items[1][qty]=1&checkout_id=" + checkout +
                           "&metadata[source]=app";
  const auto first = client.post("/v1/orders", form, form_headers(tenant, key));
  REQUIRE(first.status == 201);
  CHECK_FALSE(first.has_header("Idempotent-Replayed"));
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(first.header("Location") == "/orders/" + orders[0].order_id);
  // The API read the nesting as the sidecar did: two items, in order.
  CHECK(stored_items(db, tenant) == R"([{"qty": 2, "sku": "A-1"}, {"qty": 1, "sku": "B-2"}])");
  CHECK(db.scalar("SELECT customer_id FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == "c 42");
  CHECK(arrivals(db, tenant) == 1);

  // Other member order, %20 for '+', escaped brackets, items[] for items[0], %2D for '-'.
  const std::string respelled = "metadata%5Bsource%5D=app&checkout_id=" + checkout +
                                "&items[][sku]=A-1&items[][qty]=2&items[][sku]=B%2D2&items[][qty]=1"
                                "&amount=1000&customer_id=c%2042";
  const auto replay = client.post("/v1/orders", respelled, form_headers(tenant, key));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);  // byte for byte
  CHECK(replay.header("Location") == first.header("Location"));
  CHECK(replay.header("Content-Type") == first.header("Content-Type"));

  std::string changed = form;
  changed.replace(changed.find("amount=1000"), 11, "amount=2000");
  const auto mismatch = client.post("/v1/orders", changed, form_headers(tenant, key));
  CHECK(mismatch.status == 409);
  CHECK(problem_code(mismatch) == "idempotency_key_reused");
  // A form the sidecar refuses never reaches the API either.
  const auto ambiguous = client.post("/v1/orders", form + "&amount=1000", form_headers(tenant, unique("key")));
  CHECK(ambiguous.status == 400);
  CHECK(problem_code(ambiguous) == "invalid_form");

  CHECK(arrivals(db, tenant) == 1);
  const auto row = read_row(db, tenant, key, "POST /v1/orders");
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == first.body);
  CHECK(count_rows(db, tenant) == 1);
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}

TEST_CASE("e2e: a Square-style key in the body scopes, replays and mismatches like the header key") {
  auto route = shaped_route("create-order-body-key", "/v2/orders");
  route.key_from = "body";
  route.key_pointer = "/idempotency_key";
  OrderStack stack(with_route(route));
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto other_tenant = unique("tenant");
  const auto key = unique("sq");
  const auto checkout = unique("chk");
  auto client = stack.client();
  const auto body = R"({"idempotency_key":")" + key +
                    R"(","customer_id":"c-42","amount":1000,"items":[{"sku":"A-1","qty":2}],"checkout_id":")" +
                    checkout + "\"}";

  const auto first = client.post("/v2/orders", body, order_headers(tenant, ""));
  REQUIRE(first.status == 201);
  // Scoped by (tenant, endpoint, the member's value).
  const auto row = read_row(db, tenant, key, "POST /v2/orders");
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(orders_of(db, tenant).size() == 1);

  const auto reordered = R"({"checkout_id":")" + checkout +
                         R"(","items":[{"qty":2,"sku":"A-1"}],"amount":1e3,"customer_id":"c-42","idempotency_key":")" +
                         key + "\"}";
  const auto replay = client.post("/v2/orders", reordered, order_headers(tenant, ""));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);

  std::string changed = body;
  changed.replace(changed.find("1000"), 4, "2000");
  CHECK(problem_code(client.post("/v2/orders", changed, order_headers(tenant, ""))) == "idempotency_key_reused");
  // The key in the header as well, or instead: refused before anything is claimed.
  CHECK(problem_code(client.post("/v2/orders", body, order_headers(tenant, key))) == "idempotency_key_ambiguous");
  const auto no_member = R"({"customer_id":"c-42","amount":1000,"items":[{"sku":"A-1","qty":2}]})";
  CHECK(problem_code(client.post("/v2/orders", no_member, order_headers(tenant, unique("k")))) ==
        "idempotency_key_misplaced");
  CHECK(arrivals(db, tenant) == 1);
  CHECK(count_rows(db, tenant) == 1);

  // The same key is another tenant's own operation.
  const auto theirs = client.post("/v2/orders", body, order_headers(other_tenant, ""));
  CHECK(theirs.status == 201);
  CHECK_FALSE(theirs.has_header("Idempotent-Replayed"));
  CHECK(json_string(theirs, "order_id") != json_string(first, "order_id"));
  CHECK(orders_of(db, other_tenant).size() == 1);
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}

TEST_CASE("e2e: an AWS-style key in the query scopes, replays and mismatches like the header key") {
  auto route = shaped_route("run-order", "/v1/orders");
  route.key_from = "query";
  route.key_param = "ClientToken";
  route.fingerprint_query = true;  // the rest of the query is part of the operation; the token is not
  OrderStack stack(with_route(route));
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto token = unique("tok");
  const auto body = order_body(unique("chk"));
  auto client = stack.client();

  const auto first = client.post("/v1/orders?ClientToken=" + token + "&dry_run=false", body, order_headers(tenant, ""));
  REQUIRE(first.status == 201);
  const auto row = read_row(db, tenant, token, "POST /v1/orders");
  REQUIRE(row);
  CHECK(row->state == "completed");

  const auto replay = client.post("/v1/orders?dry_run=false&Client%54oken=" + token, body, order_headers(tenant, ""));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);
  CHECK(problem_code(client.post("/v1/orders?ClientToken=" + token + "&dry_run=true", body,
                                 order_headers(tenant, ""))) == "idempotency_key_reused");
  CHECK(problem_code(client.post("/v1/orders?ClientToken=" + token, order_body(unique("chk")),
                                 order_headers(tenant, ""))) == "idempotency_key_reused");
  CHECK(problem_code(client.post("/v1/orders?dry_run=false", body, order_headers(tenant, token))) ==
        "idempotency_key_misplaced");
  CHECK(problem_code(client.post("/v1/orders?ClientToken=a&ClientToken=a", body, order_headers(tenant, ""))) ==
        "idempotency_key_invalid");
  CHECK(arrivals(db, tenant) == 1);
  CHECK(orders_of(db, tenant).size() == 1);
  CHECK(count_rows(db, tenant) == 1);
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}

TEST_CASE("e2e: a raw route replays a protobuf body byte for byte and refuses a changed byte") {
  auto route = shaped_route("create-order-protobuf", "/v1/orders");
  route.fingerprint_format = "raw";
  route.fingerprint_media_types = {"application/x-protobuf"};
  route.fingerprint_fields.reset();
  route.fingerprint_defaults.clear();
  OrderStack stack(with_route(route));
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  auto client = stack.client();
  const auto proto = protobuf_order(unique("chk"), 1000);
  const Headers headers{{"Content-Type", "application/x-protobuf"}, {"X-Tenant-Id", tenant}, {"Idempotency-Key", key}};

  const auto first = client.post("/v1/orders", proto, headers);
  REQUIRE(first.status == 201);
  REQUIRE(orders_of(db, tenant).size() == 1);
  CHECK(stored_items(db, tenant) == R"([{"qty": 2, "sku": "A-1"}])");
  CHECK(db.scalar_int("SELECT amount FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == 1000);

  Headers respelled = headers;
  respelled[0].second = "Application/X-Protobuf";
  const auto replay = client.post("/v1/orders", proto, respelled);
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);

  // One byte of the amount's varint (1000 -> 1001): another request.
  std::string changed = proto;
  const auto at = changed.find(std::string("\x18\xe8\x07", 3));
  REQUIRE(at != std::string::npos);
  changed[at + 1] = '\xe9';
  const auto mismatch = client.post("/v1/orders", changed, headers);
  CHECK(mismatch.status == 409);
  CHECK(problem_code(mismatch) == "idempotency_key_reused");
  // The same bytes as another media type: not this route's.
  Headers other = headers;
  other[0].second = "application/octet-stream";
  other[2].second = unique("key");
  const auto refused = client.post("/v1/orders", proto, other);
  CHECK(refused.status == 415);
  CHECK(problem_code(refused) == "unsupported_media_type");

  CHECK(arrivals(db, tenant) == 1);
  CHECK(orders_of(db, tenant).size() == 1);
  CHECK(count_rows(db, tenant) == 1);
  const auto row = read_row(db, tenant, key, "POST /v1/orders");
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}
