// Fuzz target "json": proxy/idempotency's strict JSON parser and canonical text
// (json.cpp, number.cpp), differentially against support/reference_json.
//
// Input: any bytes, read as a JSON text.
// Properties:
//   1. parse_json accepts exactly what the reference accepts (RFC 8259, strict UTF-8, no
//      lone surrogates, no duplicate names, depth <= 64, number range as documented), and
//      a refusal carries a reason.
//   2. canonical_text equals the reference's canonical text (RFC 8785 layout, exact numbers,
//      members in UTF-16 order).
//   3. Fixed point: the canonical text parses back to an equal value with the same canonical
//      text.
//   4. Same value, same canonical text: the reference's respellings of the value (other
//      whitespace, member order, number and string spellings) parse to an equal value.
//   5. For numbers a double holds exactly (<= 15 significant digits), the canonical text is
//      what RFC 8785 prints for that double, derived here from std::to_chars.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/idempotency/json.cpp
// covers: proxy/idempotency/number.cpp
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include "idempotency/internal.hpp"
#include "idempotency/json.hpp"
#include "support/check.hpp"
#include "support/reference_json.hpp"

namespace {

using idem::fuzz::printable;
namespace ij = idem::idempotency;
namespace ref = idem::fuzz::ref;

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Property 5 for every number in the value.
void check_numbers_against_double(const ref::Value& v) {
  if (v.kind == ref::Value::Kind::array) {
    for (const auto& e : v.items) check_numbers_against_double(e);
  } else if (v.kind == ref::Value::Kind::object) {
    for (const auto& m : v.members) check_numbers_against_double(m.second);
  }
  if (v.kind != ref::Value::Kind::number) return;
  const auto d = ref::decompose(v.text);
  if (!d || d->digits.empty() || d->digits.size() > 15 || d->point < -290 || d->point > 290) return;
  const std::string canon = *ij::detail::canonical_number(v.text);
  const double x = std::strtod(canon.c_str(), nullptr);
  // Shortest round-trip digits of the double, in scientific form d.ddde[+-]X.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const std::size_t e = sci.find('e');
  std::string digits;
  for (std::size_t i = 0; i < e; ++i) {
    if (sci[i] >= '0' && sci[i] <= '9') digits += sci[i];
  }
  ref::Decimal from_double;
  from_double.negative = x < 0;
  from_double.digits = digits.substr(0, digits.find_last_not_of('0') + 1);
  from_double.point = std::atoll(sci.c_str() + e + 1) + 1;
  IDEM_CHECK(ref::layout(from_double) == canon,
             "number " + printable(v.text) + ": canonical " + canon + " but RFC 8785 prints " +
                 ref::layout(from_double));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string error;
  const auto mine = ij::parse_json(text, &error);
  const auto theirs = ref::parse(text);
  IDEM_CHECK(mine.has_value() == theirs.has_value(),
             std::string(mine ? "accepted" : "refused (" + error + ")") + " but the reference " +
                 (theirs ? "accepts" : "refuses") + ": " + printable(text));
  if (!mine) {
    IDEM_CHECK(error.rfind("invalid JSON: ", 0) == 0 && error.size() > 14, "reason: " + printable(error));
    return 0;
  }

  const std::string canon = ij::canonical_text(*mine);
  const std::string expected = ref::canonical(*theirs);
  IDEM_CHECK(canon == expected, "canonical " + printable(canon) + "\n  reference " + printable(expected));

  std::string again_error;
  const auto again = ij::parse_json(canon, &again_error);
  IDEM_CHECK(again.has_value(), "canonical text does not parse back (" + again_error + "): " + printable(canon));
  IDEM_CHECK(*again == *mine, "canonical text parses to another value: " + printable(canon));
  IDEM_CHECK(ij::canonical_text(*again) == canon, "canonical text is not a fixed point");

  std::mt19937_64 rng(fnv1a(text));
  for (int i = 0; i < 3; ++i) {
    const std::string other = ref::respell(*theirs, rng);
    std::string other_error;
    const auto respelled = ij::parse_json(other, &other_error);
    IDEM_CHECK(respelled.has_value(), "respelling refused (" + other_error + "): " + printable(other));
    IDEM_CHECK(*respelled == *mine, "respelling is another value: " + printable(other));
    IDEM_CHECK(ij::canonical_text(*respelled) == canon, "respelling canonicalizes differently: " + printable(other));
  }

  check_numbers_against_double(*theirs);
  return 0;
}
