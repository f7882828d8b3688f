#include "order_request.hpp"

#include <algorithm>
#include <cmath>
#include <map>

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

namespace {

// '+' is a space, %XX a byte; nullopt for any other '%'.
std::optional<std::string> form_decode(std::string_view raw) {
  std::string out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '+') {
      out += ' ';
    } else if (raw[i] == '%') {
      const auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (i + 2 >= raw.size()) return std::nullopt;
      const int hi = hex(raw[i + 1]);
      const int lo = hex(raw[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += raw[i];
    }
  }
  return out;
}

// Digits as a JSON number (the order's amounts and quantities), anything else as a string,
// which parse_order_request then refuses with its own message.
json::value form_number(const std::string& text) {
  if (!text.empty() && text.size() <= 15 && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return json::value(std::stoll(text));
  }
  return json::value(text);
}

}  // namespace

std::variant<OrderRequest, Rejection> parse_order_form(std::string_view body) {
  json::object order;
  json::array appended;                           // items[][field]
  std::map<std::size_t, json::object> numbered;   // items[N][field]
  std::size_t start = 0;
  for (;;) {
    const auto end = body.find('&', start);
    const auto part = body.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    start = end + 1;
    if (!part.empty()) {
      const auto eq = part.find('=');
      const auto name = form_decode(part.substr(0, eq));
      const auto value = form_decode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1));
      if (!name || !value) return invalid("the form has a malformed %-escape");
      if (name->rfind("items[", 0) == 0) {
        // items[N][field] or items[][field]
        const auto close = name->find(']');
        const auto open2 = close == std::string::npos ? close : name->find('[', close);
        if (close == std::string::npos || open2 != close + 1 || name->back() != ']') {
          return invalid("items are written items[N][sku] or items[][sku]");
        }
        const std::string index = name->substr(6, close - 6);
        const std::string field = name->substr(open2 + 1, name->size() - open2 - 2);
        if (index.empty()) {
          if (appended.empty() || appended.back().as_object().contains(field)) appended.emplace_back(json::object{});
          appended.back().as_object()[field] = form_number(*value);
        } else {
          if (index.size() > 3 || !std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; })) {
            return invalid("an item index must be a number below 1000");
          }
          auto& item = numbered[std::stoul(index)];
          if (item.contains(field)) return invalid("an item field is given twice");
          item[field] = form_number(*value);
        }
      } else if (name->find('[') == std::string::npos) {
        if (order.contains(*name)) return invalid("the form repeats " + *name);
        const bool numeric = *name == "amount";
        order[*name] = numeric ? form_number(*value) : json::value(*value);
      }
      // metadata[...] and other nested names: not part of the order.
    }
    if (end == std::string_view::npos) break;
  }
  if (!appended.empty() && !numbered.empty()) return invalid("items are written either items[N] or items[], not both");
  if (!numbered.empty()) {
    std::size_t expected = 0;
    for (auto& [index, item] : numbered) {
      if (index != expected++) return invalid("item indexes must run 0, 1, 2, ... without gaps");
      appended.emplace_back(std::move(item));
    }
  }
  if (!appended.empty()) order["items"] = std::move(appended);
  return parse_order_request(json::serialize(order));
}

namespace {

// A protobuf wire-format reader over one message: fields as (number, wire type, value).
class Wire {
 public:
  explicit Wire(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  bool varint(std::uint64_t& out) {
    out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= bytes_.size()) return false;
      const auto b = static_cast<unsigned char>(bytes_[at_++]);
      out |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool bytes(std::string_view& out) {
    std::uint64_t n = 0;
    if (!varint(n) || n > bytes_.size() - at_) return false;
    out = bytes_.substr(at_, n);
    at_ += n;
    return true;
  }
  bool skip(unsigned wire_type) {
    std::uint64_t ignored = 0;
    std::string_view ignored_bytes;
    const std::size_t fixed = wire_type == 1 ? 8 : wire_type == 5 ? 4 : 0;
    if (wire_type == 0) return varint(ignored);
    if (wire_type == 2) return bytes(ignored_bytes);
    if (fixed == 0 || fixed > bytes_.size() - at_) return false;
    at_ += fixed;
    return true;
  }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
};

// One message into a JSON object by its field names; `numbers` and `strings` map field
// numbers to names, `item` (field 4 of the order) is read as a nested Item.
bool read_message(std::string_view bytes, const std::map<unsigned, std::string>& strings,
                  const std::map<unsigned, std::string>& numbers, json::object& out, bool order) {
  Wire w(bytes);
  while (!w.done()) {
    std::uint64_t tag = 0;
    if (!w.varint(tag)) return false;
    const auto field = static_cast<unsigned>(tag >> 3);
    const auto type = static_cast<unsigned>(tag & 7);
    std::string_view text;
    std::uint64_t number = 0;
    if (type == 2 && strings.count(field)) {
      if (!w.bytes(text)) return false;
      out[strings.at(field)] = std::string(text);
    } else if (type == 0 && numbers.count(field)) {
      if (!w.varint(number) || number > 9007199254740992ull) return false;
      out[numbers.at(field)] = static_cast<std::int64_t>(number);
    } else if (order && type == 2 && field == 4) {
      if (!w.bytes(text)) return false;
      json::object item;
      if (!read_message(text, {{1, "sku"}}, {{2, "qty"}}, item, false)) return false;
      if (!out.contains("items")) out["items"] = json::array{};
      out["items"].as_array().push_back(std::move(item));
    } else if (!w.skip(type)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::variant<OrderRequest, Rejection> parse_order_protobuf(std::string_view body) {
  json::object order;
  if (!read_message(body, {{1, "customer_id"}, {2, "currency"}, {5, "checkout_id"}, {6, "coupon"}},
                    {{3, "amount"}}, order, true)) {
    return invalid("the body is not a well-formed Order message");
  }
  return parse_order_request(json::serialize(order));
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
