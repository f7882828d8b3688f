// Fuzz target "form": proxy/idempotency/form.cpp, the reader of form bodies, and the body
// model around it (body.cpp) on a form route.
//
// Input: byte 0 chooses the options (bit 0: repeated names as a list; bit 1: charset
// us-ascii; bit 2: tiny limits, 8 parameters and 4 levels, so the bounds are reached with
// short inputs); the rest is the body.
// Properties:
//   1. Differential: parse_form accepts exactly what the independent reference
//      (fuzz/support/reference_form, a transliteration of Rack's normalize_params with the
//      documented strictness) accepts, and then reads the same tree (canonical texts equal).
//   2. A refusal's reason is one of the fixed texts: it never carries the body's bytes.
//   3. Same form, same tree: the accepted body re-encoded (each byte literal or %XX in
//      either case, a space as '+' or %20, brackets escaped or not), with empty parts
//      added, and its parameters regrouped (parameters of different top-level names in
//      another order; those of one name keep theirs) reads to the same tree.
//   4. Bounds: an accepted body has at most max_params parameters, and its tree exactly one
//      value per parameter; the tree's canonical text is strict JSON that reads back to itself.
//   5. parse_body on a form route agrees: the same acceptance (as invalid_form) and the
//      same model, an empty body is {}.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/idempotency/form.cpp
// covers: proxy/idempotency/body.cpp
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/body.hpp"
#include "idempotency/form.hpp"
#include "idempotency/json.hpp"
#include "support/check.hpp"
#include "support/reference_form.hpp"
#include "support/reference_json.hpp"

namespace {

namespace ij = idem::idempotency;
namespace ref = idem::fuzz::ref;
using idem::fuzz::printable;

constexpr std::array<std::string_view, 12> kReasons = {
    "a '%' that is not followed by two hex digits",
    "a byte outside US-ASCII, which the charset says it is",
    "a name or value that is not UTF-8",
    "a parameter without a name",
    "text after ']' in a parameter name",
    "a '[' without ']' in a parameter name",
    "a '[' inside brackets in a parameter name",
    "a parameter name nested too deep",
    "more parameters than the limit",
    "a repeated parameter name (fingerprint.repeated_names: reject)",
    "a name used both for a value and for nested parameters",
    "a name used both for an array and for something else",
};

struct Part {
  std::string name;                  // decoded
  std::optional<std::string> value;  // decoded; nullopt: no '='
};

// The body's non-empty parts, decoded by the reference (only called on accepted bodies).
std::vector<Part> parts_of(std::string_view body) {
  std::vector<Part> out;
  std::size_t start = 0;
  for (;;) {
    const auto end = body.find('&', start);
    const auto part = body.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (!part.empty()) {
      const auto eq = part.find('=');
      Part p{*ref::form_decode(part.substr(0, eq)), std::nullopt};
      if (eq != std::string_view::npos) p.value = *ref::form_decode(part.substr(eq + 1));
      out.push_back(std::move(p));
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

// One decoded name or value written again, each byte as the rng chooses: literal where a
// literal reads the same, %XX (upper or lower hex) anywhere, a space as '+' or %20.
void encode(std::string& out, std::string_view decoded, bool is_name, std::mt19937_64& rng) {
  static constexpr char kUpper[] = "0123456789ABCDEF";
  static constexpr char kLower[] = "0123456789abcdef";
  for (const char c : decoded) {
    const auto u = static_cast<unsigned char>(c);
    const bool must_escape = c == '%' || c == '+' || c == '&' || (is_name && c == '=');
    if (c == ' ' && rng() % 2 == 0) {
      out += '+';
    } else if (must_escape || c == ' ' || rng() % 4 == 0) {
      const char* digits = rng() % 2 ? kUpper : kLower;
      out += '%';
      out += digits[u >> 4];
      out += digits[u & 0xF];
    } else {
      out += c;
    }
  }
}

// Property 3's body: groups of one top-level name in another order, each re-encoded.
std::string reencode(const std::vector<Part>& parts, std::mt19937_64& rng) {
  std::map<std::string, std::vector<const Part*>> groups;
  std::vector<std::string> order;
  for (const auto& p : parts) {
    auto top = ref::top_name(p.name);
    if (groups.find(top) == groups.end()) order.push_back(top);
    groups[top].push_back(&p);
  }
  std::shuffle(order.begin(), order.end(), rng);
  std::string out;
  for (const auto& top : order) {
    for (const Part* p : groups[top]) {
      if (rng() % 5 == 0) out += '&';  // an empty part
      if (!out.empty() && out.back() != '&') out += '&';
      if (out.empty() && rng() % 2) out += '&';
      encode(out, p->name, true, rng);
      if (p->value) {
        out += '=';
        encode(out, *p->value, false, rng);
      }
    }
  }
  if (rng() % 3 == 0) out += '&';
  return out;
}

std::size_t leaves(const ij::Json& v) {
  if (const auto* a = v.as_array()) {
    std::size_t n = 0;
    for (const auto& e : *a) n += leaves(e);
    return n;
  }
  if (const auto* o = v.as_object()) {
    std::size_t n = 0;
    for (const auto& [k, e] : *o) n += leaves(e);
    return n;
  }
  return 1;
}

void check(std::uint8_t flags, std::string_view body) {
  ij::FormOptions options;
  options.repeated_as_list = (flags & 1) != 0;
  options.ascii_only = (flags & 2) != 0;
  if ((flags & 4) != 0) options.limits = ij::FormLimits{8, 4};
  ref::FormRules rules{options.repeated_as_list, options.ascii_only, options.limits.max_params,
                       options.limits.max_depth};

  std::string why;
  const auto ours = ij::parse_form(body, options, &why);
  const auto theirs = ref::parse_form(body, rules);

  // Property 1.
  IDEM_CHECK(ours.has_value() == theirs.has_value(),
             std::string(ours ? "accepted" : "refused (" + why + ")") + " where the reference " +
                 (theirs ? "accepts" : "refuses") + ": " + printable(body));
  // Property 5.
  ij::BodySpec spec;
  spec.format = idem::settings::BodyFormat::form;
  spec.repeated_as_list = options.repeated_as_list;
  if ((flags & 4) == 0) {
    const auto parsed = ij::parse_body(spec, std::string_view(options.ascii_only ? "application/x-www-form-urlencoded; charset=US-ASCII"
                                                                              : "application/x-www-form-urlencoded"),
                                       body);
    IDEM_CHECK((parsed.status == ij::BodyStatus::ok) == ours.has_value(), "parse_body disagrees: " + parsed.reason);
    IDEM_CHECK(parsed.status == ij::BodyStatus::ok || parsed.status == ij::BodyStatus::invalid_form,
               "a form body refused with another status: " + parsed.reason);
    if (ours) IDEM_CHECK(parsed.body.model == *ours, "parse_body read another tree");
  }

  if (!ours) {
    // Property 2.
    const std::string_view prefix = "invalid form: ";
    IDEM_CHECK(why.rfind(prefix, 0) == 0 &&
                   std::find(kReasons.begin(), kReasons.end(), std::string_view(why).substr(prefix.size())) != kReasons.end(),
               "an unknown reason: " + printable(why));
    return;
  }
  const std::string text = ij::canonical_text(*ours);
  IDEM_CHECK(text == ref::canonical(*theirs),
             "another tree than the reference's for " + printable(body) + ": " + printable(text) + " vs " +
                 printable(ref::canonical(*theirs)));

  // Property 4.
  const auto parts = parts_of(body);
  IDEM_CHECK(parts.size() <= options.limits.max_params, "more parameters than the limit accepted");
  IDEM_CHECK(leaves(*ours) == parts.size(), "not one value per parameter");
  std::string json_why;
  const auto again = ij::parse_json(text, &json_why);
  IDEM_CHECK(again && ij::canonical_text(*again) == text, "the canonical text is not strict JSON: " + json_why);

  // Property 3.
  std::mt19937_64 rng(std::hash<std::string_view>{}(body) ^ flags);
  for (int round = 0; round < 2; ++round) {
    const std::string other = reencode(parts, rng);
    std::string other_why;
    const auto read = ij::parse_form(other, options, &other_why);
    IDEM_CHECK(read.has_value() && ij::canonical_text(*read) == text,
               "re-encoding changed the form: " + printable(body) + " -> " + printable(other) + " (" +
                   (read ? printable(ij::canonical_text(*read)) : other_why) + ")");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  check(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
