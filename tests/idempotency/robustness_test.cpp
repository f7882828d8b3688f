// Fuzz-ish robustness: arbitrary and mutated inputs must never crash, and whatever is
// accepted must canonicalize to a stable fixed point. Deterministic seeds so a failure
// reproduces; raise IDEM_FUZZ_ROUNDS locally for a longer run.
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "idempotency/fingerprint.hpp"
#include "idempotency/internal.hpp"
#include "idempotency/json.hpp"
#include "idempotency/key.hpp"

using namespace idem::idempotency;

namespace {

int rounds(int fallback) {
  if (const char* env = std::getenv("IDEM_FUZZ_ROUNDS")) return std::max(1, std::atoi(env));
  return fallback;
}

std::string random_bytes(std::mt19937& rng, std::size_t max_len) {
  std::uniform_int_distribution<std::size_t> len(0, max_len);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string s(len(rng), '\0');
  for (auto& c : s) c = static_cast<char>(byte(rng));
  return s;
}

// Bytes biased towards JSON syntax, so mutations reach deep parser states.
const std::string kJsonAlphabet = "{}[]\":,-+.eE0123456789 \t\n\\/ubfnrtaxlsTNF\x01\x7f\xc3\xa9\xed\xf0\x9f";

std::string mutate(std::mt19937& rng, std::string s) {
  std::uniform_int_distribution<int> ops(1, 4);
  std::uniform_int_distribution<std::size_t> pick(0, kJsonAlphabet.size() - 1);
  const int n = ops(rng);
  for (int i = 0; i < n; ++i) {
    std::uniform_int_distribution<std::size_t> pos(0, s.size());
    const std::size_t p = pos(rng);
    switch (rng() % 4) {
      case 0: s.insert(s.begin() + static_cast<std::ptrdiff_t>(p), kJsonAlphabet[pick(rng)]); break;
      case 1:
        if (p < s.size()) s.erase(p, 1);
        break;
      case 2:
        if (p < s.size()) s[p] = kJsonAlphabet[pick(rng)];
        break;
      default:
        if (p < s.size()) s.insert(p, s.substr(p, std::min<std::size_t>(8, s.size() - p)));
    }
  }
  return s;
}

const std::vector<std::string> kSeeds = {
    R"({"customer_id":"c1","currency":"EUR","amount":1000.50,"items":[{"sku":"a","qty":1},{"sku":"b"}]})",
    R"([1,-0,1e3,0.000001,12345678901234567890123,1E-7,"\u00e9\ud83d\ude00",true,false,null])",
    R"({"a":{"b":{"c":[[],{}]}},"\u20ac":"x","":""})",
    R"("\"\\\/\b\f\n\r\t")",
    "0",
};

void check_fixed_point(const Json& v) {
  const std::string once = canonical_text(v);
  std::string error;
  const auto again = parse_json(once, &error);
  REQUIRE_MESSAGE(again.has_value(), error);
  CHECK(*again == v);
  CHECK(canonical_text(*again) == once);
}

}  // namespace

TEST_CASE("robustness: random bytes into parse_json") {
  std::mt19937 rng(20240601);
  const int n = rounds(20000);
  int accepted = 0;
  for (int i = 0; i < n; ++i) {
    const std::string input = random_bytes(rng, 48);
    std::string error;
    const auto v = parse_json(input, &error, JsonLimits{8});
    if (v) {
      ++accepted;
      check_fixed_point(*v);
    } else {
      CHECK_FALSE(error.empty());
    }
  }
  MESSAGE("random inputs accepted as JSON: ", accepted, " of ", n);
}

TEST_CASE("robustness: mutated JSON into parse_json and fingerprint") {
  std::mt19937 rng(7);
  const int n = rounds(20000);
  idem::settings::FingerprintSettings fs;
  fs.fields = std::vector<std::string>{"/items/*/sku", "/amount", "", "/a/b/c/0"};
  fs.ignore = {"/items/*/qty", "/0"};
  fs.defaults = {{"/items/*/sku", "\"none\""}, {"/amount", "0"}};
  const auto fields_spec = FingerprintSpec::compile(fs);
  idem::settings::FingerprintSettings whole;
  whole.ignore = {"/items/*/qty", "/a/b", "/*/0"};
  whole.defaults = {{"/currency", "\"EUR\""}, {"/items/*/qty", "1"}};
  const auto whole_spec = FingerprintSpec::compile(whole);

  int accepted = 0;
  for (int i = 0; i < n; ++i) {
    const std::string input = mutate(rng, kSeeds[static_cast<std::size_t>(i) % kSeeds.size()]);
    std::string error;
    const auto v = parse_json(input, &error);
    if (v) {
      ++accepted;
      check_fixed_point(*v);
    }
    for (const auto* spec : {&fields_spec, &whole_spec}) {
      RequestParts req;
      req.method = "POST";
      req.scope = "POST /orders";
      req.content_type = "application/json";
      req.body = input;
      const auto r = fingerprint(*spec, req);
      if (v) {
        CHECK(r.status == FingerprintStatus::ok);
        CHECK(r.value.size() == 64);
      } else {
        CHECK(r.status == (input.empty() ? FingerprintStatus::ok : FingerprintStatus::invalid_json));
      }
    }
  }
  MESSAGE("mutated inputs accepted as JSON: ", accepted, " of ", n);
  CHECK(accepted > 0);
}

TEST_CASE("robustness: random numbers canonicalize to a fixed point") {
  std::mt19937 rng(99);
  const int n = rounds(20000);
  std::uniform_int_distribution<int> digits(1, 40);
  std::uniform_int_distribution<int> digit(0, 9);
  std::uniform_int_distribution<int> expo(-60, 60);
  for (int i = 0; i < n; ++i) {
    std::string lex;
    if (rng() % 2) lex.push_back('-');
    const int k = digits(rng);
    std::string ds;
    for (int j = 0; j < k; ++j) ds.push_back(static_cast<char>('0' + digit(rng)));
    // Make it a valid int part: no leading zero unless it is just "0".
    if (ds.size() > 1 && ds[0] == '0') ds[0] = '1';
    lex += ds;
    if (rng() % 2) {
      lex.push_back('.');
      const int f = digits(rng);
      for (int j = 0; j < f; ++j) lex.push_back(static_cast<char>('0' + digit(rng)));
    }
    if (rng() % 2) lex += (rng() % 2 ? "e" : "E") + std::to_string(expo(rng));
    CAPTURE(lex);
    const auto c = detail::canonical_number(lex);
    REQUIRE(c.has_value());
    CHECK(detail::canonical_number(*c) == c);
    std::string error;
    CHECK(parse_json(lex, &error).has_value());
  }
}

TEST_CASE("robustness: random field values into parse_key") {
  std::mt19937 rng(4242);
  const int n = rounds(20000);
  const std::string key_alphabet = "\"\\ ,\tab;=\x01\x7f\xc3";
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> values(rng() % 3);
    for (auto& v : values) {
      if (rng() % 2) {
        v = random_bytes(rng, 40);
      } else {
        v.resize(rng() % 12);
        for (auto& c : v) c = key_alphabet[rng() % key_alphabet.size()];
      }
    }
    const std::vector<std::string_view> views(values.begin(), values.end());
    const std::size_t max = rng() % 20;
    const auto r = parse_key(views, max);
    switch (r.status) {
      case KeyStatus::missing: CHECK(values.empty()); break;
      case KeyStatus::invalid: CHECK_FALSE(r.reason.empty()); break;
      case KeyStatus::ok:
        REQUIRE(values.size() == 1);
        CHECK_FALSE(r.key.empty());
        CHECK(r.key.size() <= max);
        for (const char c : r.key) CHECK((c >= 0x21 && c <= 0x7E));
        // The accepted key, written either way, parses back to itself.
        if (r.key.find(',') == std::string::npos && r.key.front() != '"') {
          const std::string_view bare = r.key;
          CHECK(parse_key(std::span(&bare, 1), max).key == r.key);
        }
        break;
      case KeyStatus::misplaced:
      case KeyStatus::ambiguous:
        FAIL("parse_key reads one header: a key is never misplaced or ambiguous there");
        break;
    }
  }
}

TEST_CASE("robustness: random query strings canonicalize idempotently") {
  std::mt19937 rng(31337);
  const int n = rounds(20000);
  const std::string alphabet = "ab=&%+2F0zZ~ \xc3\xa9";
  for (int i = 0; i < n; ++i) {
    std::string q(rng() % 24, ' ');
    for (auto& c : q) c = alphabet[rng() % alphabet.size()];
    CAPTURE(q);
    const std::string once = detail::canonical_query(q);
    CHECK(detail::canonical_query(once) == once);
  }
}
