#pragma once
// An independent reference for proxy/idempotency/form.cpp: application/x-www-form-urlencoded
// read by the rules of docs/configuration.md (§4.4, "Forms"), written as a transliteration
// of Rack's QueryParser#normalize_params (recursion on the unparsed rest of the name, as
// Rack does it) with the documented strictness, not from form.cpp, whose reader splits
// names into segments first. Deliberately simple and slow.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "support/reference_json.hpp"

namespace idem::fuzz::ref {

struct FormRules {
  bool repeated_as_list = false;
  bool ascii_only = false;
  std::size_t max_params = 4096;
  std::size_t max_depth = 32;
};

// The form as a ref::Value tree (object members in insertion order; strings; null for a
// parameter without '='; arrays), or nullopt when the documented rules refuse it.
std::optional<Value> parse_form(std::string_view body, const FormRules& rules);

// Form decoding of one name or value: '+' is a space, %XX a byte; nullopt for any other '%'.
std::optional<std::string> form_decode(std::string_view raw);

// The name a parameter groups under: its decoded name up to the first '[' after the first
// character (the whole name when there is none).
std::string top_name(std::string_view decoded_name);

}  // namespace idem::fuzz::ref
