// Strict JSON parsing into an exact tree, and RFC 8785-style canonical text.
//
// Boost.JSON's SAX parser does the RFC 8259 validation (grammar, UTF-8, escapes,
// surrogate pairs, no comments, no trailing commas, no NaN); we build our own tree from
// its events because boost::json::value would turn numbers into doubles/int64 and
// silently keep the last of duplicate keys -- both of which break "same meaning, same
// fingerprint".
#include "idempotency/json.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include <boost/json/basic_parser_impl.hpp>

#include "idempotency/internal.hpp"

namespace idem::idempotency {

namespace {

namespace bj = boost::json;

std::string_view sv(bj::string_view s) noexcept { return {s.data(), s.size()}; }

// SAX handler that assembles a Json tree. Errors it detects itself (duplicates, depth,
// numbers) are reported through `reason`; Boost's own errors through the error_code.
class TreeBuilder {
 public:
  static constexpr std::size_t max_object_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_array_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_key_size = std::numeric_limits<std::size_t>::max();
  static constexpr std::size_t max_string_size = std::numeric_limits<std::size_t>::max();

  explicit TreeBuilder(std::size_t max_depth) : max_depth_(max_depth) {}

  std::optional<Json>& root() noexcept { return root_; }
  const std::string& reason() const noexcept { return reason_; }

  bool on_document_begin(bj::error_code&) { return true; }
  bool on_document_end(bj::error_code&) { return true; }

  bool on_array_begin(bj::error_code& ec) { return open(Json::Array{}, ec); }
  bool on_array_end(std::size_t, bj::error_code& ec) { return close(ec); }
  bool on_object_begin(bj::error_code& ec) { return open(Json::Object{}, ec); }
  bool on_object_end(std::size_t, bj::error_code& ec) { return close(ec); }

  bool on_string_part(bj::string_view s, std::size_t, bj::error_code&) {
    text_.append(sv(s));
    return true;
  }
  bool on_string(bj::string_view s, std::size_t, bj::error_code& ec) {
    text_.append(sv(s));
    std::string v = std::move(text_);
    text_.clear();
    return emit(Json(Json::Value(std::move(v))), ec);
  }

  bool on_key_part(bj::string_view s, std::size_t, bj::error_code&) {
    text_.append(sv(s));
    return true;
  }
  bool on_key(bj::string_view s, std::size_t, bj::error_code& ec) {
    text_.append(sv(s));
    Frame& f = frames_.back();
    // Refused rather than resolved: backends disagree on first-wins vs last-wins, so
    // any choice we made could fingerprint a body differently from how it is executed.
    if (f.value.as_object()->count(text_) != 0) return fail("duplicate object key", ec);
    f.key = std::move(text_);
    text_.clear();
    return true;
  }

  // Only the lexeme matters; Boost's int64/uint64/double conversion is ignored.
  bool on_number_part(bj::string_view s, bj::error_code&) {
    number_.append(sv(s));
    return true;
  }
  bool on_int64(std::int64_t, bj::string_view s, bj::error_code& ec) { return number(s, ec); }
  bool on_uint64(std::uint64_t, bj::string_view s, bj::error_code& ec) { return number(s, ec); }
  bool on_double(double, bj::string_view s, bj::error_code& ec) { return number(s, ec); }

  bool on_bool(bool b, bj::error_code& ec) { return emit(Json(Json::Value(b)), ec); }
  bool on_null(bj::error_code& ec) { return emit(Json(), ec); }

  // Comments are disabled in the parse options; refuse them here too.
  bool on_comment_part(bj::string_view, bj::error_code& ec) { return fail("comment", ec); }
  bool on_comment(bj::string_view, bj::error_code& ec) { return fail("comment", ec); }

 private:
  struct Frame {
    Json value;       // an Array or an Object under construction
    std::string key;  // objects: the key whose value comes next
  };

  bool fail(const char* why, bj::error_code& ec) {
    reason_ = why;
    ec = bj::make_error_code(bj::error::syntax);
    return false;
  }

  bool open(Json::Value container, bj::error_code& ec) {
    if (frames_.size() >= max_depth_) {
      return fail("nesting deeper than the limit", ec);
    }
    frames_.push_back(Frame{Json(std::move(container)), {}});
    return true;
  }

  bool close(bj::error_code& ec) {
    Json done = std::move(frames_.back().value);
    frames_.pop_back();
    return emit(std::move(done), ec);
  }

  bool number(bj::string_view tail, bj::error_code& ec) {
    number_.append(sv(tail));
    auto canonical = detail::canonical_number(number_);
    number_.clear();
    if (!canonical) return fail("number exponent out of range", ec);
    return emit(Json(Json::Value(Json::Number{std::move(*canonical)})), ec);
  }

  bool emit(Json v, bj::error_code&) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame& f = frames_.back();
    if (auto* a = f.value.as_array()) {
      a->push_back(std::move(v));
    } else {
      f.value.as_object()->emplace(std::move(f.key), std::move(v));
      f.key.clear();
    }
    return true;
  }

  std::size_t max_depth_;
  std::vector<Frame> frames_;
  std::optional<Json> root_;
  std::string text_;    // string or key being assembled from parts
  std::string number_;  // number lexeme being assembled from parts
  std::string reason_;
};

void append_canonical(std::string& out, const Json& v) {
  struct Visitor {
    std::string& out;
    void operator()(std::nullptr_t) const { out.append("null"); }
    void operator()(bool b) const { out.append(b ? "true" : "false"); }
    void operator()(const Json::Number& n) const { out.append(n.canonical); }
    void operator()(const std::string& s) const { detail::append_json_string(out, s); }
    void operator()(const Json::Array& a) const {
      out.push_back('[');
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i != 0) out.push_back(',');
        append_canonical(out, a[i]);
      }
      out.push_back(']');
    }
    void operator()(const Json::Object& o) const {
      // The map keeps UTF-8 byte order; RFC 8785 wants UTF-16 code-unit order. They
      // differ only between U+E000..U+FFFF and astral characters, but a canonical form
      // that is "almost" the standard one is a trap for anyone re-implementing it. ASCII
      // keys (nearly all) are in both orders already: they go out in the map's order,
      // unsorted.
      const bool map_order = std::none_of(o.begin(), o.end(), [](const auto& m) {
        return std::any_of(m.first.begin(), m.first.end(),
                           [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
      });
      if (map_order) {
        out.push_back('{');
        bool first = true;
        for (const auto& [key, value] : o) {
          if (!first) out.push_back(',');
          first = false;
          detail::append_json_string(out, key);
          out.push_back(':');
          append_canonical(out, value);
        }
        out.push_back('}');
        return;
      }
      std::vector<const Json::Object::value_type*> members;
      members.reserve(o.size());
      for (const auto& m : o) members.push_back(&m);
      std::sort(members.begin(), members.end(), [](const auto* a, const auto* b) {
        return detail::utf16_less(a->first, b->first);
      });
      out.push_back('{');
      bool first = true;
      for (const auto* m : members) {
        if (!first) out.push_back(',');
        first = false;
        detail::append_json_string(out, m->first);
        out.push_back(':');
        append_canonical(out, m->second);
      }
      out.push_back('}');
    }
  };
  std::visit(Visitor{out}, v.value());
}

// Strict UTF-8 decoding of one code point at s[i]; advances i. Returns a value above
// U+10FFFF (0x110000 + byte) for a byte that does not start a well-formed sequence, so
// the caller can still order arbitrary bytes totally.
std::uint32_t decode_utf8(std::string_view s, std::size_t& i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const auto invalid = [&]() noexcept {
    ++i;
    return 0x110000u + b0;
  };
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  std::size_t len;
  std::uint32_t cp;
  std::uint32_t min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1Fu, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0Fu, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07u, min = 0x10000;
  } else {
    return invalid();
  }
  if (s.size() - i < len) return invalid();
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0u) != 0x80u) return invalid();
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid();
  i += len;
  return cp;
}

// Yields the UTF-16 code units of a UTF-8 string one at a time.
class Utf16Units {
 public:
  explicit Utf16Units(std::string_view s) noexcept : s_(s) {}
  bool next(std::uint32_t& unit) noexcept {
    if (pending_ != 0) {
      unit = pending_;
      pending_ = 0;
      return true;
    }
    if (pos_ >= s_.size()) return false;
    const std::uint32_t cp = decode_utf8(s_, pos_);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      unit = 0xD800 + ((cp - 0x10000) >> 10);
      pending_ = 0xDC00 + ((cp - 0x10000) & 0x3FF);
    } else {
      unit = cp;  // BMP code unit, or an out-of-range marker for an invalid byte
    }
    return true;
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
  std::uint32_t pending_ = 0;  // low surrogate still to yield (never 0 when set)
};

struct EqualVisitor {
  const Json::Value& other;
  bool operator()(std::nullptr_t) const { return std::holds_alternative<std::nullptr_t>(other); }
  bool operator()(bool v) const {
    const bool* o = std::get_if<bool>(&other);
    return o != nullptr && *o == v;
  }
  bool operator()(const Json::Number& v) const {
    const auto* o = std::get_if<Json::Number>(&other);
    return o != nullptr && o->canonical == v.canonical;
  }
  bool operator()(const std::string& v) const {
    const auto* o = std::get_if<std::string>(&other);
    return o != nullptr && *o == v;
  }
  bool operator()(const Json::Array& v) const {
    const auto* o = std::get_if<Json::Array>(&other);
    return o != nullptr && *o == v;
  }
  bool operator()(const Json::Object& v) const {
    const auto* o = std::get_if<Json::Object>(&other);
    return o != nullptr && *o == v;
  }
};

}  // namespace

bool Json::operator==(const Json& other) const {
  return std::visit(EqualVisitor{other.value_}, value_);
}

std::optional<Json> parse_json(std::string_view text, std::string* error,
                               const JsonLimits& limits) {
  bj::parse_options opt;
  opt.allow_comments = false;
  opt.allow_trailing_commas = false;
  opt.allow_invalid_utf8 = false;
  // Our handler enforces limits.max_depth with its own message; Boost's limit is set
  // just above it so it never fires first (saturating: max_depth may be SIZE_MAX).
  opt.max_depth = limits.max_depth == std::numeric_limits<std::size_t>::max()
                      ? limits.max_depth
                      : limits.max_depth + 1;

  bj::basic_parser<TreeBuilder> parser(opt, limits.max_depth);
  bj::error_code ec;
  const std::size_t used = parser.write_some(false, text.data(), text.size(), ec);

  const auto failed = [&](std::string why) -> std::optional<Json> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  if (ec) {
    const std::string& own = parser.handler().reason();
    // Boost's messages are fixed strings ("syntax error", "expected comma", ...):
    // they never contain body bytes, so they are safe to return and log.
    return failed("invalid JSON: " + (own.empty() ? ec.message() : own));
  }
  if (used != text.size()) return failed("invalid JSON: data after the value");
  if (!parser.done() || !parser.handler().root()) return failed("invalid JSON: incomplete");
  return std::move(parser.handler().root());
}

std::string canonical_text(const Json& value) {
  std::string out;
  append_canonical(out, value);
  return out;
}

namespace detail {

bool is_valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    if (decode_utf8(s, i) > 0x10FFFF) return false;
  }
  return true;
}

bool utf16_less(std::string_view a, std::string_view b) noexcept {
  Utf16Units ua(a);
  Utf16Units ub(b);
  for (;;) {
    std::uint32_t x = 0;
    std::uint32_t y = 0;
    const bool hx = ua.next(x);
    const bool hy = ub.next(y);
    if (!hx || !hy) return !hx && hy;  // a proper prefix sorts first
    if (x != y) return x < y;
  }
}

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (std::size_t i = 0; i < s.size(); ++i) {
    // A run of bytes that go out literally (nearly every key and value) is appended whole.
    std::size_t run = i;
    while (run < s.size() && static_cast<unsigned char>(s[run]) >= 0x20 && s[run] != '"' &&
           s[run] != '\\') {
      ++run;
    }
    if (run != i) {
      out.append(s.data() + i, run - i);
      i = run - 1;
      continue;
    }
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (u < 0x20) {
          out.append("\\u");
          text::append_hex_digits(out, u, 4);
        } else {
          out.push_back(c);  // includes DEL and all non-ASCII UTF-8 bytes, literally
        }
    }
  }
  out.push_back('"');
}

}  // namespace detail

}  // namespace idem::idempotency
