#pragma once
// A small immutable JSON document that keeps numbers exact (as canonical decimal text)
// and refuses duplicate object keys, so two requests that mean the same thing to a
// backend always canonicalize alike and ambiguous bodies are refused. Pure code.
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace idem::idempotency {

class Json {
 public:
  struct Number {
    std::string canonical;  // exact canonical decimal form: 1000, 1000.0 and 1e3 -> same text
  };
  using Array = std::vector<Json>;
  // Keys as UTF-8. The map iterates in UTF-8 byte order; canonical_text re-sorts members
  // by UTF-16 code units (RFC 8785), which differs for U+E000..U+FFFF vs astral keys.
  using Object = std::map<std::string, Json>;
  using Value = std::variant<std::nullptr_t, bool, Number, std::string, Array, Object>;

  Json() : value_(nullptr) {}
  explicit Json(Value v) : value_(std::move(v)) {}

  const Value& value() const noexcept { return value_; }
  bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(value_); }
  const Array* as_array() const noexcept { return std::get_if<Array>(&value_); }
  const Object* as_object() const noexcept { return std::get_if<Object>(&value_); }
  Array* as_array() noexcept { return std::get_if<Array>(&value_); }
  Object* as_object() noexcept { return std::get_if<Object>(&value_); }

  bool operator==(const Json& other) const;

 private:
  Value value_;
};

struct JsonLimits {
  std::size_t max_depth = 64;
};

// Strict RFC 8259 parse (UTF-8 validated, duplicate keys refused, depth limited).
// nullopt on failure with a short reason in *error (no body content echoed).
std::optional<Json> parse_json(std::string_view text, std::string* error,
                               const JsonLimits& limits = {});

// RFC 8785-style canonical text: object keys sorted, no insignificant whitespace,
// minimal string escaping, numbers in their canonical form.
std::string canonical_text(const Json& value);

}  // namespace idem::idempotency
