// Fuzz target "key": Idempotency-Key parsing (proxy/idempotency/key.cpp).
//
// Input: byte 0 picks max_length and the number of field lines (0-3); the rest is split at
// '\n' into the field values (the last value takes the remainder).
// Properties:
//   1. parse_key agrees with an independent reading of docs/http.md's rules (RFC 8941
//      sf-string parsing per RFC 8941 §4.2.5, bare values without ',', visible ASCII,
//      1..max_length characters): same status, same key.
//   2. A reason is given exactly for invalid keys and is one of the fixed texts: it never
//      echoes the client's value.
//   3. Round trip: an accepted key, written bare (when it can be) or as an sf-string, with or
//      without surrounding OWS, parses back to itself; any visible-ASCII key of acceptable
//      length written as an sf-string parses to itself; two field lines are always refused.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/idempotency/key.cpp
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/key.hpp"
#include "support/check.hpp"

namespace {

namespace ij = idem::idempotency;
using idem::fuzz::printable;

struct Expected {
  ij::KeyStatus status;
  std::string key;
};

bool visible(char c) { return static_cast<unsigned char>(c) >= 0x21 && static_cast<unsigned char>(c) <= 0x7E; }

// docs/http.md, written independently of key.cpp.
Expected reference(const std::vector<std::string>& values, std::size_t max_length) {
  if (values.empty()) return {ij::KeyStatus::missing, ""};
  if (values.size() != 1) return {ij::KeyStatus::invalid, ""};
  std::string_view v = values[0];
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  std::string key;
  if (!v.empty() && v.front() == '"') {
    // RFC 8941 §4.2.5 "Parsing a String", then: nothing may follow (no parameters).
    std::size_t i = 1;
    bool closed = false;
    while (i < v.size()) {
      const char c = v[i++];
      if (c == '\\') {
        if (i >= v.size()) return {ij::KeyStatus::invalid, ""};
        const char n = v[i++];
        if (n != '"' && n != '\\') return {ij::KeyStatus::invalid, ""};
        key += n;
      } else if (c == '"') {
        closed = true;
        break;
      } else {
        key += c;
      }
    }
    if (!closed || i != v.size()) return {ij::KeyStatus::invalid, ""};
  } else {
    if (v.find(',') != std::string_view::npos) return {ij::KeyStatus::invalid, ""};
    key = std::string(v);
  }
  if (key.empty() || key.size() > max_length) return {ij::KeyStatus::invalid, ""};
  for (const char c : key) {
    if (!visible(c)) return {ij::KeyStatus::invalid, ""};
  }
  return {ij::KeyStatus::ok, key};
}

ij::KeyParse parse(const std::vector<std::string>& values, std::size_t max_length) {
  std::vector<std::string_view> views(values.begin(), values.end());
  return ij::parse_key(std::span<const std::string_view>(views), max_length);
}

std::string sf_string(std::string_view key) {
  std::string out = "\"";
  for (const char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

const std::set<std::string>& reasons(std::size_t max_length) {
  static std::set<std::string> fixed = {
      "several Idempotency-Key values",
      "empty Idempotency-Key",
      "quoted key has an escape other than \\\" or \\\\",
      "quoted key is followed by other characters (parameters or a list)",
      "quoted key has no closing quote",
      "Idempotency-Key contains ',' (reads as several values)",
      "Idempotency-Key has a character outside visible ASCII (0x21-0x7E)",
  };
  static std::set<std::string> with_length;
  with_length = fixed;
  with_length.insert("Idempotency-Key longer than " + std::to_string(max_length) + " characters");
  return with_length;
}

void check(const std::vector<std::string>& values, std::size_t max_length) {
  const ij::KeyParse got = parse(values, max_length);
  const Expected want = reference(values, max_length);
  std::string shown;
  for (const auto& v : values) shown += "[" + printable(v) + "]";
  IDEM_CHECK(got.status == want.status, "status differs from the rules for " + shown + " (reason: " + got.reason + ")");
  IDEM_CHECK(got.key == want.key, "key " + printable(got.key) + " but the rules say " + printable(want.key));
  if (got.status == ij::KeyStatus::invalid) {
    IDEM_CHECK(reasons(max_length).count(got.reason) == 1, "unexpected reason text: " + printable(got.reason));
  } else {
    IDEM_CHECK(got.reason.empty(), "reason on success: " + printable(got.reason));
  }
}

void round_trip(const std::string& key, std::size_t max_length) {
  const auto expect_key = [&](const std::vector<std::string>& values) {
    const ij::KeyParse r = parse(values, max_length);
    IDEM_CHECK(r.status == ij::KeyStatus::ok && r.key == key,
               "key " + printable(key) + " written as " + printable(values[0]) + " does not parse back");
  };
  const std::string quoted = sf_string(key);
  expect_key({quoted});
  expect_key({" \t" + quoted + "\t "});
  if (key.find(',') == std::string::npos && key.front() != '"') {
    expect_key({key});
    expect_key({"  " + key + "\t"});
  }
  const ij::KeyParse two = parse({key, key}, max_length);
  IDEM_CHECK(two.status == ij::KeyStatus::invalid, "two field lines accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static constexpr std::size_t kMaxLengths[] = {255, 1, 8, 64};
  const std::size_t max_length = kMaxLengths[data[0] & 3];
  const std::size_t count = (data[0] >> 2) & 3;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::vector<std::string> values;
  std::size_t pos = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t nl = i + 1 < count ? rest.find('\n', pos) : std::string_view::npos;
    values.emplace_back(rest.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos));
    pos = nl == std::string_view::npos ? rest.size() : nl + 1;
  }
  check(values, max_length);

  const ij::KeyParse got = parse(values, max_length);
  if (got.status == ij::KeyStatus::ok) round_trip(got.key, max_length);

  // The whole remainder as a candidate key: if it is a valid key, every spelling must work.
  const std::string candidate(rest);
  bool valid = !candidate.empty() && candidate.size() <= max_length;
  for (const char c : candidate) valid = valid && visible(c);
  if (valid) {
    round_trip(candidate, max_length);
  } else {
    check({sf_string(candidate)}, max_length);
  }
  return 0;
}
