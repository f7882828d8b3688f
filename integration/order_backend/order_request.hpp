#pragma once
// The order API's request body: parsing and every check that depends on the body alone.
// Pure code (no I/O), so the rules are unit-tested without a server or a database.
//
// Those checks are deterministic, so the order API may run them before it looks for an
// earlier attempt of the same operation: the same body is always refused the same way.
// Checks that depend on time or data (an expired coupon) come after that lookup, so that
// a retry of an operation that already created its order gets the order back.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace idem::demo {

struct OrderItem {
  std::string sku;
  std::int64_t qty = 0;
};

struct OrderRequest {
  std::string customer_id;
  std::string currency;     // "EUR" when absent: the sidecar's fingerprint default agrees
  std::int64_t amount = 0;  // minor units (cents)
  std::vector<OrderItem> items;
  std::optional<std::string> checkout_id;
  std::optional<std::string> coupon;
};

// A refusal as the API answers it: 400 invalid_request for a malformed body, 422 for a
// well-formed order the business rules refuse.
struct Rejection {
  int status = 400;
  std::string code;
  std::string title;
  std::string detail;
};

std::variant<OrderRequest, Rejection> parse_order_request(std::string_view body);

// The same order as an application/x-www-form-urlencoded form, the way Stripe-style APIs
// take it: customer_id=c-42&amount=1000&items[0][sku]=A-1&items[0][qty]=2&checkout_id=...
// (items also as items[][sku]=...&items[][qty]=..., Rack's way: a field the last item
// already has starts the next one). Numbers are digits; metadata[...] and any other name
// are not part of the order (idempotency_key included), as unknown JSON members are not.
// A malformed form, a repeated name or numbered items with gaps is 400 invalid_request;
// then the same rules as parse_order_request.
std::variant<OrderRequest, Rejection> parse_order_form(std::string_view body);

// The same order in the protobuf wire format (application/x-protobuf), for the sidecar's
// raw routes:  message Order { string customer_id = 1; string currency = 2; int64 amount = 3;
// repeated Item items = 4; string checkout_id = 5; string coupon = 6; }
// message Item { string sku = 1; int64 qty = 2; }. Unknown fields are skipped, as protobuf
// readers do; a truncated or malformed message is 400 invalid_request.
std::variant<OrderRequest, Rejection> parse_order_protobuf(std::string_view body);

// The items as the canonical JSON array stored with the order and sent to inventory:
// [{"sku":"A-1","qty":2}], in request order.
std::string items_json(const std::vector<OrderItem>& items);

}  // namespace idem::demo
