// Fuzz target "header_codec": the stored form of replay headers (proxy/store/header_codec).
//
// Input: read twice. (a) As the text of a response_headers column, for the decoder.
// (b) Through FuzzedDataProvider as a list of (name, value) byte strings, for the encoder.
// Properties:
//   1. Round trip: decode(encode(h)) == h for every list of arbitrary byte strings (order,
//      repeats, NUL, invalid UTF-8, controls).
//   2. The encoding is storable: valid UTF-8 without NUL, no \u0000 escape (jsonb refuses
//      both), and valid JSON to the independent reference parser.
//   3. The decoder agrees with the reference JSON parser on valid UTF-8 input: it accepts
//      exactly the arrays of [string, string] and [hex, hex, "hex"] pairs, with the same
//      decoded bytes; and whatever it decodes re-encodes to text that decodes the same.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/store/header_codec.cpp
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/header_codec.hpp"
#include "support/check.hpp"
#include "support/reference_json.hpp"

namespace {

namespace sd = idem::store::detail;
using idem::store::StoredHeader;
using idem::fuzz::printable;
namespace ref = idem::fuzz::ref;

std::optional<std::string> unhex(const std::string& s) {
  if (s.size() % 2 != 0) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < s.size(); i += 2) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = s[i + k];
      const int d = (c >= '0' && c <= '9')   ? c - '0'
                    : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                             : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + d;
    }
    out += static_cast<char>(v);
  }
  return out;
}

// What the stored shape means, read through the reference parser; nullopt if it is not it.
std::optional<std::vector<StoredHeader>> expected_decode(std::string_view text) {
  const auto v = ref::parse(text);
  if (!v || v->kind != ref::Value::Kind::array) return std::nullopt;
  std::vector<StoredHeader> out;
  for (const auto& item : v->items) {
    if (item.kind != ref::Value::Kind::array) return std::nullopt;
    const auto& e = item.items;
    if (e.size() != 2 && e.size() != 3) return std::nullopt;
    for (const auto& s : e) {
      if (s.kind != ref::Value::Kind::string) return std::nullopt;
    }
    if (e.size() == 2) {
      out.push_back({e[0].text, e[1].text});
      continue;
    }
    if (e[2].text != "hex") return std::nullopt;
    auto name = unhex(e[0].text);
    auto value = unhex(e[1].text);
    if (!name || !value) return std::nullopt;
    out.push_back({*name, *value});
  }
  return out;
}

bool same(const std::vector<StoredHeader>& a, const std::vector<StoredHeader>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].value != b[i].value) return false;
  }
  return true;
}

// A NUL in a decoded string means a \u0000 escape in the text.
bool has_nul(const ref::Value& v) {
  if (v.kind == ref::Value::Kind::string) return v.text.find('\0') != std::string::npos;
  for (const auto& e : v.items) {
    if (has_nul(e)) return true;
  }
  return false;
}

void check_encoding(const std::vector<StoredHeader>& headers) {
  const std::string text = sd::encode_headers_json(headers);
  IDEM_CHECK(sd::is_storable_text(text), "encoding is not storable text: " + printable(text));
  IDEM_CHECK(ref::valid_utf8(text), "encoding is not UTF-8: " + printable(text));
  const auto json = ref::parse(text);
  IDEM_CHECK(json.has_value(), "encoding is not JSON: " + printable(text));
  IDEM_CHECK(!has_nul(*json), "encoding has a \\u0000 escape: " + printable(text));
  const auto back = sd::decode_headers_json(text);
  IDEM_CHECK(back.has_value(), "encoding does not decode: " + printable(text));
  IDEM_CHECK(same(*back, headers), "decode(encode(h)) != h for " + printable(text));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // (a) the decoder on arbitrary column text.
  const auto decoded = sd::decode_headers_json(text);
  if (ref::valid_utf8(text)) {
    const auto expected = expected_decode(text);
    IDEM_CHECK(decoded.has_value() == expected.has_value(),
               std::string(decoded ? "decoded" : "refused") + " but the reference " +
                   (expected ? "reads the stored shape" : "does not") + ": " + printable(text));
    if (decoded) IDEM_CHECK(same(*decoded, *expected), "decoded bytes differ: " + printable(text));
  }
  if (decoded) check_encoding(*decoded);

  // (b) the encoder on arbitrary header lists.
  FuzzedDataProvider fdp(data, size);
  std::vector<StoredHeader> headers;
  while (fdp.remaining_bytes() > 0 && headers.size() < 64) {
    std::string name = fdp.ConsumeRandomLengthString(64);
    std::string value = fdp.ConsumeRandomLengthString(256);
    headers.push_back({std::move(name), std::move(value)});
  }
  check_encoding(headers);
  return 0;
}
