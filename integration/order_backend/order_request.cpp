#include "order_request.hpp"

#include <algorithm>
#include <cmath>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace idem::demo {
namespace {

namespace json = boost::json;

constexpr std::size_t kMaxItems = 100;
constexpr std::int64_t kMaxQty = 1000;
// 2^53: the largest range in which every integer survives a trip through a double, which
// is how many JSON clients (JavaScript) hold numbers.
constexpr double kMaxExactDouble = 9007199254740992.0;

Rejection invalid(std::string detail) {
  return {400, "invalid_request", "Invalid order request", std::move(detail)};
}

// A JSON number holding a whole value: 1000, 1000.0 and 1e3 are the same amount, as
// they are the same in the sidecar's fingerprint. nullopt for anything else.
std::optional<std::int64_t> whole_number(const json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) {
    if (v.get_uint64() > static_cast<std::uint64_t>(kMaxExactDouble)) return std::nullopt;
    return static_cast<std::int64_t>(v.get_uint64());
  }
  if (v.is_double()) {
    const double d = v.get_double();
    if (!std::isfinite(d) || std::trunc(d) != d || std::fabs(d) > kMaxExactDouble) {
      return std::nullopt;
    }
    return static_cast<std::int64_t>(d);
  }
  return std::nullopt;
}

// An optional string member: absent and null mean "not given"; anything else must be a
// string of 1..max_length bytes. Returns false (with `error` set) when invalid.
bool optional_string(const json::object& o, std::string_view name, std::size_t max_length,
                     std::optional<std::string>& out, std::optional<Rejection>& error) {
  const auto* v = o.if_contains(name);
  if (v == nullptr || v->is_null()) return true;
  if (!v->is_string() || v->get_string().empty() || v->get_string().size() > max_length) {
    error = invalid(std::string(name) + " must be a string of 1 to " + std::to_string(max_length) +
                    " bytes");
    return false;
  }
  out = std::string(v->get_string());
  return true;
}

}  // namespace

std::variant<OrderRequest, Rejection> parse_order_request(std::string_view body) {
  boost::system::error_code ec;
  const json::value doc = json::parse(body, ec);
  if (ec) return invalid("the body is not valid JSON");
  if (!doc.is_object()) return invalid("the body must be a JSON object");
  const json::object& o = doc.get_object();
  OrderRequest req;

  const auto* customer = o.if_contains("customer_id");
  if (customer == nullptr || !customer->is_string() || customer->get_string().empty() ||
      customer->get_string().size() > 100) {
    return invalid("customer_id must be a string of 1 to 100 bytes");
  }
  req.customer_id = std::string(customer->get_string());

  req.currency = "EUR";
  if (const auto* currency = o.if_contains("currency"); currency && !currency->is_null()) {
    const bool iso_like = currency->is_string() && currency->get_string().size() == 3 &&
                          std::all_of(currency->get_string().begin(), currency->get_string().end(),
                                      [](char c) { return c >= 'A' && c <= 'Z'; });
    if (!iso_like) return invalid("currency must be three capital letters (ISO 4217)");
    req.currency = std::string(currency->get_string());
  }

  const auto* amount = o.if_contains("amount");
  if (amount == nullptr) return invalid("amount is required (an integer, in minor units)");
  const auto whole = whole_number(*amount);
  if (!whole) return invalid("amount must be a whole number of minor units");
  req.amount = *whole;

  const auto* items = o.if_contains("items");
  if (items == nullptr || !items->is_array() || items->get_array().empty() ||
      items->get_array().size() > kMaxItems) {
    return invalid("items must be an array of 1 to " + std::to_string(kMaxItems) + " items");
  }
  for (const auto& item : items->get_array()) {
    const auto* fields = item.if_object();
    const auto* sku = fields ? fields->if_contains("sku") : nullptr;
    const auto* qty = fields ? fields->if_contains("qty") : nullptr;
    // 0 stands for "absent or not a whole number": both fail the range check below.
    const std::int64_t qty_value = qty ? whole_number(*qty).value_or(0) : 0;
    if (sku == nullptr || !sku->is_string() || sku->get_string().empty() ||
        sku->get_string().size() > 64 || qty_value < 1 || qty_value > kMaxQty) {
      return invalid("every item needs a sku (1 to 64 bytes) and a qty from 1 to " +
                     std::to_string(kMaxQty));
    }
    req.items.push_back({std::string(sku->get_string()), qty_value});
  }

  std::optional<Rejection> error;
  if (!optional_string(o, "checkout_id", 128, req.checkout_id, error) ||
      !optional_string(o, "coupon", 64, req.coupon, error)) {
    return *error;
  }

  // Business rules last: a body that is malformed and also refused by a rule is reported
  // as malformed, which is what the client has to fix first.
  if (req.amount <= 0) {
    return Rejection{422, "invalid_amount", "Invalid amount",
                     "the order amount must be greater than zero"};
  }
  return req;
}

std::string items_json(const std::vector<OrderItem>& items) {
  json::array out;
  out.reserve(items.size());
  for (const auto& item : items) {
    out.push_back(json::object{{"sku", item.sku}, {"qty", item.qty}});
  }
  return json::serialize(out);
}

}  // namespace idem::demo
