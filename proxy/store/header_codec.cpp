#include "store/header_codec.hpp"

#include "common/json_text.hpp"
#include "common/text.hpp"

#include <cstdint>

namespace idem::store::detail {
namespace {

using text::from_hex;
using text::hex_value;
using text::to_hex;

// Every stored pair is valid UTF-8 by now (others went through to_hex), so the shared
// escaper never has to repair anything here.
using text::append_json_string;

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// A minimal cursor over the fixed shape; every method returns false on malformed input.
class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool expect(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  bool at_end() {
    skip_ws();
    return pos_ == s_.size();
  }

  bool string(std::string& out) {
    if (!expect('"')) return false;
    out.clear();
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      switch (s_[pos_++]) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate.
            std::uint32_t low = 0;
            if (pos_ + 1 >= s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u') return false;
            pos_ += 2;
            if (!hex4(low) || low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return false;
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

 private:
  bool hex4(std::uint32_t& out) {
    if (pos_ + 4 > s_.size()) return false;
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const int v = hex_value(s_[pos_++]);
      if (v < 0) return false;
      out = (out << 4) | static_cast<std::uint32_t>(v);
    }
    return true;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

bool is_storable_text(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c == 0) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (i + len > n) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

std::string encode_headers_json(const std::vector<StoredHeader>& headers) {
  std::string out = "[";
  bool first = true;
  for (const StoredHeader& h : headers) {
    if (!first) out.push_back(',');
    first = false;
    out.push_back('[');
    if (is_storable_text(h.name) && is_storable_text(h.value)) {
      append_json_string(out, h.name);
      out.push_back(',');
      append_json_string(out, h.value);
    } else {
      append_json_string(out, to_hex(h.name));
      out.push_back(',');
      append_json_string(out, to_hex(h.value));
      out += ",\"hex\"";
    }
    out.push_back(']');
  }
  out.push_back(']');
  return out;
}

std::optional<std::vector<StoredHeader>> decode_headers_json(std::string_view json) {
  Parser p(json);
  std::vector<StoredHeader> headers;
  if (!p.expect('[')) return std::nullopt;
  if (p.expect(']')) return p.at_end() ? std::optional(std::move(headers)) : std::nullopt;
  std::string name, value, tag;
  do {
    if (!p.expect('[') || !p.string(name) || !p.expect(',') || !p.string(value)) {
      return std::nullopt;
    }
    if (p.expect(',')) {
      if (!p.string(tag) || tag != "hex") return std::nullopt;
      auto n = from_hex(name);
      auto v = from_hex(value);
      if (!n || !v) return std::nullopt;
      name = std::move(*n);
      value = std::move(*v);
    }
    if (!p.expect(']')) return std::nullopt;
    headers.push_back({name, value});
  } while (p.expect(','));
  if (!p.expect(']') || !p.at_end()) return std::nullopt;
  return headers;
}

}  // namespace idem::store::detail
