#pragma once
// application/x-www-form-urlencoded bodies, read as Stripe and Rack read them, into the Json
// tree the fingerprint and the key reader share (body.hpp). Pure code, bounded: at most
// FormLimits::max_params parameters and max_depth levels, time and memory linear in the
// body. Strict where readers disagree: what two backends could read differently is refused,
// never guessed (docs/configuration.md, §4.4 lists every rule).
//
//   items[0][sku]=A1&items[0][qty]=2&metadata[source]=app&expand[]=customer
//   -> {"expand":["customer"],"items":[{"qty":"2","sku":"A1"}],"metadata":{"source":"app"}}
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/json.hpp"

namespace idem::idempotency {

struct FormLimits {
  std::size_t max_params = 4096;  // non-empty '&'-separated parts
  std::size_t max_depth = 32;     // levels of a name: the name itself and each bracket
};

struct FormOptions {
  bool repeated_as_list = false;  // "a=1&a=2": a list (true) or refused (false)
  bool ascii_only = false;        // charset=us-ascii: every decoded byte below 0x80
  FormLimits limits;
};

// The form as a tree: an object of strings (a parameter without '=' is null), objects
// (name[key]) and arrays (name[] appends; an object whose keys are exactly 0..n-1, written
// name[0], name[1], ..., is the array of its values). nullopt with a fixed, body-free
// reason in *error when the body is refused.
std::optional<Json> parse_form(std::string_view body, const FormOptions& options, std::string* error);

// A form field path ("idempotency_key", "metadata[key]", "items[0][sku]") as the segments of
// the tree parse_form builds; nullopt when it is not one name with bracketed keys (an empty
// name, "[]", an unclosed or stray bracket).
std::optional<std::vector<std::string>> form_field_path(std::string_view path);

}  // namespace idem::idempotency
