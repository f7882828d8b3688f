#pragma once
// An independent reference for proxy/idempotency's JSON: a strict RFC 8259 parser, the
// canonical text (RFC 8785 layout, exact numbers, UTF-16 member order) and a "respeller"
// that writes the same value differently (whitespace, member order, number and string
// spellings). Written from the RFCs and docs/, not from json.cpp/number.cpp, so the json
// and fingerprint targets can fuzz the two differentially. Deliberately simple and slow.
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::fuzz::ref {

struct Member;

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;  // number: the lexeme as written; string: the decoded UTF-8
  std::vector<Value> items;                            // array
  std::vector<Member> members;  // object, in input order
};

struct Member {
  std::string first;  // name
  Value second;
};

struct ParseLimits {
  std::size_t max_depth = 64;           // containers nested deeper are refused
  std::int64_t max_exponent = 1000000000;  // |written exponent| above this is refused
};

// nullopt unless `text` is one RFC 8259 JSON text (surrounding whitespace allowed) with
// strictly valid UTF-8, no lone surrogate escapes, no duplicate member names (compared
// after unescaping), within the limits.
std::optional<Value> parse(std::string_view text, const ParseLimits& limits = {});

// A number as  (-)0.D x 10^point : D the significant digits without leading or trailing
// zeros (empty for zero, which is never negative).
struct Decimal {
  bool negative = false;
  std::string digits;
  std::int64_t point = 0;
};

// nullopt if `lexeme` is not an RFC 8259 number or its exponent exceeds the limit.
std::optional<Decimal> decompose(std::string_view lexeme, std::int64_t max_exponent = 1000000000);

// ECMAScript Number::toString's layout of the digits (RFC 8785 §3.2.2.3), all digits kept.
std::string layout(const Decimal& d);

// Canonical text of a parsed value (numbers via decompose + layout).
std::string canonical(const Value& v);

// The same value written differently; `rng` chooses the spelling. The result must parse
// (with the same limits) to a value whose canonical text equals canonical(v).
std::string respell(const Value& v, std::mt19937_64& rng);

// Another lexeme for the number d (d must come from decompose with the same limit).
std::string respell_number(const Decimal& d, std::mt19937_64& rng, std::int64_t max_exponent = 1000000000);

// Equality by value (numbers by Decimal, objects as sets of members).
bool same_value(const Value& a, const Value& b);

}  // namespace idem::fuzz::ref

namespace idem::fuzz::ref {
// Strictly well-formed UTF-8 (Unicode Table 3-7).
bool valid_utf8(std::string_view s);
}  // namespace idem::fuzz::ref
