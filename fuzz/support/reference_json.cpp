// Reference JSON (see reference_json.hpp). Written from RFC 8259, RFC 8785 and
// proxy/idempotency/README.md; shares no code with proxy/idempotency on purpose.
#include "support/reference_json.hpp"

#include "support/check.hpp"

#include <algorithm>
#include <limits>

namespace idem::fuzz::ref {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void put_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode 15 Table 3-7 (well-formed UTF-8 byte sequences), as a table of ranges.
// Returns the sequence length at s[i], 0 if ill-formed; *cp receives the code point.
std::size_t utf8_at(std::string_view s, std::size_t i, std::uint32_t* cp) {
  struct Row {
    unsigned char lead_lo, lead_hi, b2_lo, b2_hi;
    std::size_t len;
  };
  static constexpr Row kRows[] = {
      {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3}, {0xE1, 0xEC, 0x80, 0xBF, 3},
      {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3}, {0xF0, 0xF0, 0x90, 0xBF, 4},
      {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
  };
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  for (const Row& r : kRows) {
    if (b0 < r.lead_lo || b0 > r.lead_hi) continue;
    if (i + r.len > s.size()) return 0;
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b1 < r.b2_lo || b1 > r.b2_hi) return 0;
    std::uint32_t v = b0 & (r.len == 2 ? 0x1F : r.len == 3 ? 0x0F : 0x07);
    for (std::size_t k = 1; k < r.len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < 0x80 || b > 0xBF) return 0;
      v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return r.len;
  }
  return 0;
}

class Parser {
 public:
  Parser(std::string_view s, const ParseLimits& limits) : s_(s), limits_(limits) {}

  std::optional<Value> document() {
    skip_ws();
    Value v;
    if (!value(v, 0)) return std::nullopt;
    skip_ws();
    if (pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip_ws() {
    while (pos_ < s_.size() && is_ws(s_[pos_])) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  // `depth` = containers already open around this value.
  bool value(Value& out, std::size_t depth) {
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{' || c == '[') {
      if (depth + 1 > limits_.max_depth) return false;
      return c == '{' ? object(out, depth + 1) : array(out, depth + 1);
    }
    if (c == '"') {
      out.kind = Value::Kind::string;
      return string(out.text);
    }
    if (c == 't' || c == 'f') {
      out.kind = Value::Kind::boolean;
      out.boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      out.kind = Value::Kind::null;
      return literal("null");
    }
    out.kind = Value::Kind::number;
    return number(out.text);
  }

  bool object(Value& out, std::size_t depth) {
    out.kind = Value::Kind::object;
    ++pos_;  // '{'
    skip_ws();
    if (eat('}')) return true;
    for (;;) {
      skip_ws();
      std::string key;
      if (!string(key)) return false;
      for (const auto& m : out.members) {
        if (m.first == key) return false;  // duplicate member name
      }
      skip_ws();
      if (!eat(':')) return false;
      skip_ws();
      Value v;
      if (!value(v, depth)) return false;
      out.members.push_back(Member{std::move(key), std::move(v)});
      skip_ws();
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }

  bool array(Value& out, std::size_t depth) {
    out.kind = Value::Kind::array;
    ++pos_;  // '['
    skip_ws();
    if (eat(']')) return true;
    for (;;) {
      skip_ws();
      Value v;
      if (!value(v, depth)) return false;
      out.items.push_back(std::move(v));
      skip_ws();
      if (eat(']')) return true;
      if (!eat(',')) return false;
    }
  }

  bool hex4(std::uint32_t& v) {
    if (pos_ + 4 > s_.size()) return false;
    v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = hex_digit(s_[pos_++]);
      if (d < 0) return false;
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return true;
  }

  bool string(std::string& out) {
    if (!eat('"')) return false;
    for (;;) {
      if (pos_ >= s_.size()) return false;
      const char c = s_[pos_];
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (u < 0x20) return false;
      if (c != '\\') {
        std::uint32_t cp = 0;
        const std::size_t n = utf8_at(s_, pos_, &cp);
        if (n == 0) return false;
        out.append(s_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // lone low surrogate
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            std::uint32_t low = 0;
            if (!literal("\\u") || !hex4(low) || low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          return false;
      }
    }
  }

  // Only the grammar; the exponent limit is decompose()'s business.
  bool number(std::string& out) {
    const std::size_t b = pos_;
    eat('-');
    if (pos_ >= s_.size() || !is_digit(s_[pos_])) return false;
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    }
    if (eat('.')) {
      const std::size_t f = pos_;
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
      if (pos_ == f) return false;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!eat('+')) eat('-');
      const std::size_t f = pos_;
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
      if (pos_ == f) return false;
    }
    out.assign(s_.substr(b, pos_ - b));
    return decompose(out, limits_.max_exponent).has_value();
  }

  std::string_view s_;
  ParseLimits limits_;
  std::size_t pos_ = 0;
};

std::u16string to_utf16(std::string_view s) {
  std::u16string out;
  for (std::size_t i = 0; i < s.size();) {
    std::uint32_t cp = 0;
    std::size_t n = utf8_at(s, i, &cp);
    if (n == 0) {  // cannot happen for parsed keys; keep the order total anyway
      cp = 0xFFFD;
      n = 1;
    }
    if (cp >= 0x10000) {
      out += static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10));
      out += static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      out += static_cast<char16_t>(cp);
    }
    i += n;
  }
  return out;
}

void canonical_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\b') {
      out += "\\b";
    } else if (c == '\f') {
      out += "\\f";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

void canonical_into(std::string& out, const Value& v) {
  switch (v.kind) {
    case Value::Kind::null: out += "null"; return;
    case Value::Kind::boolean: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::number: out += layout(*decompose(v.text, std::numeric_limits<std::int64_t>::max())); return;
    case Value::Kind::string: canonical_string(out, v.text); return;
    case Value::Kind::array:
      out += '[';
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ',';
        canonical_into(out, v.items[i]);
      }
      out += ']';
      return;
    case Value::Kind::object: {
      std::vector<std::pair<std::u16string, const Member*>> sorted;
      for (const auto& m : v.members) sorted.emplace_back(to_utf16(m.first), &m);
      std::sort(sorted.begin(), sorted.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (std::size_t i = 0; i < sorted.size(); ++i) {
        if (i) out += ',';
        canonical_string(out, sorted[i].second->first);
        out += ':';
        canonical_into(out, sorted[i].second->second);
      }
      out += '}';
      return;
    }
  }
}

// ---------------------------------------------------------------- respelling

template <class T>
T pick(std::mt19937_64& rng, T lo, T hi) {
  return std::uniform_int_distribution<T>(lo, hi)(rng);
}

void some_ws(std::string& out, std::mt19937_64& rng) {
  static constexpr char kWs[] = {' ', '\t', '\n', '\r'};
  if (pick(rng, 0, 2) != 0) return;
  for (int n = pick(rng, 1, 3); n > 0; --n) out += kWs[pick(rng, 0, 3)];
}

void respell_string(std::string& out, std::string_view s, std::mt19937_64& rng) {
  static constexpr char kLower[] = "0123456789abcdef";
  static constexpr char kUpper[] = "0123456789ABCDEF";
  const auto u_escape = [&](std::uint32_t unit) {
    const char* hex = pick(rng, 0, 1) ? kLower : kUpper;
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += hex[(unit >> shift) & 15];
  };
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    std::uint32_t cp = 0;
    const std::size_t n = utf8_at(s, i, &cp);
    // Only a parsed value or a UTF-8 name is respelled: anything else is a harness error,
    // reported rather than looped on (a default named by a non-UTF-8 pointer once looped
    // here, writing \u0000 forever).
    IDEM_CHECK(n != 0, "respell: the string is not UTF-8 at byte " + std::to_string(i));
    const bool must_escape = cp < 0x20 || cp == '"' || cp == '\\';
    if (!must_escape && pick(rng, 0, 3) != 0) {
      out.append(s.substr(i, n));
    } else if (cp == '/' && pick(rng, 0, 1)) {
      out += "\\/";
    } else if (cp >= 0x10000) {
      u_escape(0xD800 + ((cp - 0x10000) >> 10));
      u_escape(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      const char* short_form = cp == '"'    ? "\\\""
                               : cp == '\\' ? "\\\\"
                               : cp == '\b' ? "\\b"
                               : cp == '\f' ? "\\f"
                               : cp == '\n' ? "\\n"
                               : cp == '\r' ? "\\r"
                               : cp == '\t' ? "\\t"
                                            : nullptr;
      if (short_form != nullptr && pick(rng, 0, 1)) {
        out += short_form;
      } else {
        u_escape(cp);
      }
    }
    i += n;
  }
  out += '"';
}

void respell_into(std::string& out, const Value& v, std::mt19937_64& rng) {
  some_ws(out, rng);
  switch (v.kind) {
    case Value::Kind::null: out += "null"; break;
    case Value::Kind::boolean: out += v.boolean ? "true" : "false"; break;
    case Value::Kind::number: out += respell_number(*decompose(v.text, std::numeric_limits<std::int64_t>::max()), rng); break;
    case Value::Kind::string: respell_string(out, v.text, rng); break;
    case Value::Kind::array:
      out += '[';
      for (std::size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ',';
        respell_into(out, v.items[i], rng);
      }
      some_ws(out, rng);
      out += ']';
      break;
    case Value::Kind::object: {
      std::vector<const Member*> order;
      for (const auto& m : v.members) order.push_back(&m);
      std::shuffle(order.begin(), order.end(), rng);
      out += '{';
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (i) out += ',';
        some_ws(out, rng);
        respell_string(out, order[i]->first, rng);
        some_ws(out, rng);
        out += ':';
        respell_into(out, order[i]->second, rng);
      }
      some_ws(out, rng);
      out += '}';
      break;
    }
  }
  some_ws(out, rng);
}

}  // namespace

std::optional<Value> parse(std::string_view text, const ParseLimits& limits) {
  return Parser(text, limits).document();
}

// Value = (int digits . frac digits) x 10^E. With all = int + frac and f the index of its
// first non-zero digit, the value is 0.all[f..] x 10^(|int| + E - f).
std::optional<Decimal> decompose(std::string_view s, std::int64_t max_exponent) {
  std::size_t i = 0;
  Decimal d;
  d.negative = i < s.size() && s[i] == '-';
  if (d.negative) ++i;
  const std::size_t int_begin = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  const std::size_t int_len = i - int_begin;
  if (int_len == 0 || (int_len > 1 && s[int_begin] == '0')) return std::nullopt;
  std::string all(s.substr(int_begin, int_len));
  if (i < s.size() && s[i] == '.') {
    const std::size_t b = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i == b) return std::nullopt;
    all.append(s.substr(b, i - b));
  }
  // The written exponent, saturated (the bound below is far lower).
  constexpr std::int64_t kSaturated = 1'000'000'000'000'000;
  std::int64_t e = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    const std::size_t b = i;
    while (i < s.size() && is_digit(s[i])) {
      e = std::min<std::int64_t>(kSaturated, e * 10 + (s[i] - '0'));
      ++i;
    }
    if (i == b) return std::nullopt;
    if (neg) e = -e;
  }
  if (i != s.size()) return std::nullopt;
  // Two bounds (proxy/idempotency/README.md): on the exponent as written, which keeps every
  // computation small, and on the value's own exponent, so that an accepted number's
  // canonical form (whose exponent is the value's) is accepted too.
  if (e > max_exponent || e < -max_exponent) return std::nullopt;

  const std::size_t f = all.find_first_not_of('0');
  if (f == std::string::npos) return Decimal{};  // zero, whatever its sign and exponent
  const std::size_t l = all.find_last_not_of('0');
  d.digits = all.substr(f, l - f + 1);
  d.point = static_cast<std::int64_t>(int_len) + e - static_cast<std::int64_t>(f);
  // The bound is on the value (its scientific exponent point - 1), not on how it is written.
  const std::int64_t sci = d.point - 1;
  if (sci > max_exponent || sci < -max_exponent) return std::nullopt;
  return d;
}

std::string layout(const Decimal& d) {
  if (d.digits.empty()) return "0";
  const auto k = static_cast<std::int64_t>(d.digits.size());
  const std::int64_t n = d.point;
  std::string out = d.negative ? "-" : "";
  if (k <= n && n <= 21) {
    out += d.digits + std::string(static_cast<std::size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += d.digits.substr(0, static_cast<std::size_t>(n)) + "." +
           d.digits.substr(static_cast<std::size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-n), '0') + d.digits;
  } else {
    out += d.digits.substr(0, 1);
    if (k > 1) out += "." + d.digits.substr(1);
    const std::int64_t e = n - 1;
    out += e < 0 ? "e-" : "e+";
    out += std::to_string(e < 0 ? -e : e);
  }
  return out;
}

std::string respell_number(const Decimal& d, std::mt19937_64& rng, std::int64_t max_exponent) {
  static const char* const kZeros[] = {"0", "-0", "0.0", "-0.000", "0e0", "0E+7", "-0e-12", "0.00E5"};
  if (d.digits.empty()) return kZeros[pick(rng, 0, 7)];
  const auto k = static_cast<std::int64_t>(d.digits.size());
  std::string out = d.negative ? "-" : "";
  // Mantissa with j significant digits before its point (j == 0: "0." then z zeros), then
  // t trailing zeros; the exponent makes up the difference: n - j + z.
  const std::int64_t j = pick<std::int64_t>(rng, 0, std::min<std::int64_t>(k, 30));
  const std::int64_t z = j == 0 ? pick(rng, 0, 3) : 0;
  const std::int64_t t = pick(rng, 0, 2);
  const std::int64_t e = d.point - j + z;
  // Writing the exponent out as zeros keeps some spellings exponent-free.
  const bool plain = e >= 0 && e <= 25 && pick(rng, 0, 1);
  std::string int_part = j == 0 ? "0" : d.digits.substr(0, static_cast<std::size_t>(j));
  std::string frac = std::string(static_cast<std::size_t>(z), '0') +
                     d.digits.substr(static_cast<std::size_t>(j)) +
                     std::string(static_cast<std::size_t>(t), '0');
  if (plain) {
    // Move e digits from frac to int (padding with zeros).
    const auto take = static_cast<std::size_t>(e);
    std::string moved = frac.substr(0, std::min(take, frac.size()));
    moved.resize(take, '0');
    frac = frac.size() > take ? frac.substr(take) : "";
    int_part += moved;
    const std::size_t nz = int_part.find_first_not_of('0');
    int_part = nz == std::string::npos ? "0" : int_part.substr(nz);
    out += int_part;
    if (!frac.empty()) out += "." + frac;
    return out;
  }
  if (e > max_exponent || e < -max_exponent) return out + layout(Decimal{false, d.digits, d.point});
  out += int_part;
  if (!frac.empty()) out += "." + frac;
  out += pick(rng, 0, 1) ? 'e' : 'E';
  if (e < 0) {
    out += '-';
  } else if (pick(rng, 0, 1)) {
    out += '+';
  }
  out += std::string(static_cast<std::size_t>(pick(rng, 0, 1) ? 0 : pick(rng, 1, 3)), '0');
  out += std::to_string(e < 0 ? -e : e);
  return out;
}

std::string canonical(const Value& v) {
  std::string out;
  canonical_into(out, v);
  return out;
}

std::string respell(const Value& v, std::mt19937_64& rng) {
  std::string out;
  respell_into(out, v, rng);
  return out;
}

bool same_value(const Value& a, const Value& b) { return canonical(a) == canonical(b); }

}  // namespace idem::fuzz::ref

namespace idem::fuzz::ref {
bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::uint32_t cp = 0;
    const std::size_t n = utf8_at(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}
}  // namespace idem::fuzz::ref
