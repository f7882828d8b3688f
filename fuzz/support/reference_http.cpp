// Reference request and response reader (see reference_http.hpp), from RFC 9112 §2-§9 and
// RFC 9110 §5, §8.6.
#include "support/reference_http.hpp"

#include <limits>

namespace idem::fuzz::ref_http {

namespace {

struct Incomplete {};
struct Invalid {
  const char* why;
};

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
bool is_ows(char c) { return c == ' ' || c == '\t'; }
// field-vchar / SP / HTAB (RFC 9110 §5.5): no CTL except HTAB, no DEL.
bool is_field_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u == '\t' || (u >= 0x20 && u != 0x7F);
}
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }
bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

class Reader {
 public:
  Reader(std::string_view in, std::size_t pos) : in_(in), pos_(pos) {}
  std::size_t pos() const { return pos_; }

  // One line without its CRLF. A CR not followed by LF, or a bare LF, is invalid
  // (RFC 9112 §2.2 lets a recipient accept bare LF; a proxy must not, since the next hop
  // may not).
  std::string_view line() {
    for (std::size_t i = pos_; i < in_.size(); ++i) {
      if (in_[i] == '\n') throw Invalid{"bare LF"};
      if (in_[i] == '\r') {
        if (i + 1 >= in_.size()) throw Incomplete{};
        if (in_[i + 1] != '\n') throw Invalid{"bare CR"};
        const std::string_view l = in_.substr(pos_, i - pos_);
        pos_ = i + 2;
        return l;
      }
    }
    throw Incomplete{};
  }

  std::string_view bytes(std::uint64_t n) {
    if (in_.size() - pos_ < n) throw Incomplete{};
    const std::string_view b = in_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return b;
  }

  // field-line CRLF ... CRLF (RFC 9112 §5), with obs-fold replaced by SP (§5.2).
  std::vector<Field> fields() {
    std::vector<Field> out;
    for (;;) {
      const std::string_view l = line();
      if (l.empty()) return out;
      if (is_ows(l.front())) {
        if (out.empty()) throw Invalid{"whitespace before the first field line"};
        for (const char c : l) {
          if (!is_field_char(c)) throw Invalid{"control character in a field value"};
        }
        Field& f = out.back();
        f.value = std::string(trim(f.value + " " + std::string(trim(l))));
        f.folded = true;
        continue;
      }
      std::size_t i = 0;
      while (i < l.size() && is_tchar(l[i])) ++i;
      if (i == 0 || i >= l.size() || l[i] != ':') throw Invalid{"malformed field name"};
      const std::string_view value = l.substr(i + 1);
      for (const char c : value) {
        if (!is_field_char(c)) throw Invalid{"control character in a field value"};
      }
      out.push_back(Field{std::string(l.substr(0, i)), std::string(trim(value)), false});
    }
  }

 private:
  std::string_view in_;
  std::size_t pos_;
};

// chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )  (RFC 9112 §7.1.1)
void check_chunk_ext(std::string_view s) {
  std::size_t i = 0;
  const auto bws = [&] {
    while (i < s.size() && is_ows(s[i])) ++i;
  };
  const auto token = [&] {
    const std::size_t b = i;
    while (i < s.size() && is_tchar(s[i])) ++i;
    if (i == b) throw Invalid{"chunk extension: token expected"};
  };
  while (i < s.size()) {
    bws();
    if (i >= s.size() || s[i] != ';') throw Invalid{"chunk extension: ';' expected"};
    ++i;
    bws();
    token();
    const std::size_t before = i;
    bws();
    if (i < s.size() && s[i] == '=') {
      ++i;
      bws();
      if (i < s.size() && s[i] == '"') {
        ++i;
        for (;;) {
          if (i >= s.size()) throw Invalid{"chunk extension: unterminated quoted-string"};
          const auto u = static_cast<unsigned char>(s[i]);
          if (u == '"') {
            ++i;
            break;
          }
          if (u == '\\') {
            if (i + 1 >= s.size()) throw Invalid{"chunk extension: bad quoted-pair"};
            const auto q = static_cast<unsigned char>(s[i + 1]);
            if (!(q == '\t' || q == ' ' || (q >= 0x21 && q != 0x7F))) {
              throw Invalid{"chunk extension: bad quoted-pair"};
            }
            i += 2;
            continue;
          }
          if (!(u == '\t' || u == ' ' || u == 0x21 || (u >= 0x23 && u != 0x7F))) {
            throw Invalid{"chunk extension: bad qdtext"};
          }
          ++i;
        }
      } else {
        token();
      }
    } else {
      i = before;  // BWS that is not followed by '=' belongs to the next ';'
    }
  }
}

// Message: Request or Response (the same members for the chunked body).
template <class Message>
void read_chunked(Reader& r, Message& req) {
  for (;;) {
    const std::string_view l = r.line();
    std::size_t i = 0;
    std::uint64_t size = 0;
    while (i < l.size() && hex_value(l[i]) >= 0) {
      if (size > (std::numeric_limits<std::uint64_t>::max() >> 4)) throw Invalid{"chunk size overflows"};
      size = size * 16 + static_cast<std::uint64_t>(hex_value(l[i]));
      ++i;
    }
    if (i == 0) throw Invalid{"chunk size expected"};
    check_chunk_ext(l.substr(i));
    req.extension_bytes += l.size() - i;
    if (size == 0) {
      req.trailers = r.fields();
      for (const Field& f : req.trailers) req.trailer_bytes += f.name.size() + f.value.size() + 4;
      return;
    }
    req.body.append(r.bytes(size));
    if (!r.line().empty()) throw Invalid{"chunk data not followed by CRLF"};
  }
}

}  // namespace

Framing framing_of(const std::vector<Field>& fields, int version, std::uint64_t* length) {
  std::size_t cl = 0;
  std::size_t te = 0;
  std::string_view cl_value;
  std::string_view te_value;
  for (const Field& f : fields) {
    if (iequal(f.name, "content-length")) {
      ++cl;
      cl_value = f.value;
    } else if (iequal(f.name, "transfer-encoding")) {
      ++te;
      te_value = f.value;
    }
  }
  if (cl > 0 && te > 0) return Framing::invalid;
  if (te > 0) {
    if (version < 11 || te > 1 || !iequal(te_value, "chunked")) return Framing::invalid;
    return Framing::chunked;
  }
  if (cl > 1) return Framing::invalid;
  if (cl == 0) return Framing::none;
  if (cl_value.empty()) return Framing::invalid;
  std::uint64_t n = 0;
  for (const char c : cl_value) {
    if (c < '0' || c > '9') return Framing::invalid;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (n > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return Framing::invalid;
    n = n * 10 + d;
  }
  *length = n;
  return Framing::length;
}

Result parse_request(std::string_view input, std::size_t offset) {
  Result res;
  Request& req = res.request;
  Reader r(input, offset);
  try {
    // request-line = method SP request-target SP HTTP-version   (RFC 9112 §3)
    const std::string_view l = r.line();
    std::size_t i = 0;
    while (i < l.size() && is_tchar(l[i])) ++i;
    if (i == 0 || i >= l.size() || l[i] != ' ') throw Invalid{"malformed method"};
    req.method = std::string(l.substr(0, i));
    const std::size_t t = ++i;
    // The target's own syntax (RFC 3986) is the target normalizer's business; here only
    // what delimits it: no SP, no CTL, no DEL.
    while (i < l.size() && static_cast<unsigned char>(l[i]) > 0x20 &&
           static_cast<unsigned char>(l[i]) != 0x7F) {
      ++i;
    }
    if (i == t || i >= l.size() || l[i] != ' ') throw Invalid{"malformed request-target"};
    req.target = std::string(l.substr(t, i - t));
    const std::string_view v = l.substr(i + 1);
    if (v == "HTTP/1.1") {
      req.version = 11;
    } else if (v == "HTTP/1.0") {
      req.version = 10;
    } else {
      throw Invalid{"unsupported HTTP-version"};
    }

    req.fields = r.fields();
    res.header_complete = true;
    res.header_end = r.pos();

    req.framing = framing_of(req.fields, req.version, &req.length);
    switch (req.framing) {
      case Framing::invalid: throw Invalid{"ambiguous or malformed framing"};
      case Framing::none: break;
      case Framing::length: req.body = std::string(r.bytes(req.length)); break;
      case Framing::chunked: read_chunked(r, req); break;
    }
    req.end = r.pos();
    res.status = Status::ok;
  } catch (const Incomplete&) {
    res.status = Status::incomplete;
  } catch (const Invalid& e) {
    res.status = Status::invalid;
    res.why = e.why;
  }
  return res;
}

namespace {

// A #rule list (RFC 9110 §5.6.1): elements separated by commas with OWS around them; empty
// elements are ignored, as a recipient must.
std::vector<std::string_view> list_elements(std::string_view v) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto comma = v.find(',');
    const std::string_view e = trim(v.substr(0, comma));
    if (!e.empty()) out.push_back(e);
    if (comma == std::string_view::npos) return out;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

ResponseFraming response_framing_of(const std::vector<Field>& fields, int version, int status,
                                    bool head, std::uint64_t* length) {
  if (head || status / 100 == 1 || status == 204 || status == 304) return ResponseFraming::none;
  std::size_t te = 0;
  std::string_view te_value;
  bool has_cl = false;
  bool have_length = false;
  bool bad_length = false;
  std::uint64_t n = 0;
  for (const Field& f : fields) {
    if (iequal(f.name, "transfer-encoding")) {
      ++te;
      te_value = f.value;
      continue;
    }
    if (!iequal(f.name, "content-length")) continue;
    has_cl = true;
    const auto elements = list_elements(f.value);
    if (elements.empty()) bad_length = true;
    for (const std::string_view e : elements) {
      std::uint64_t v = 0;
      for (const char c : e) {
        if (c < '0' || c > '9') {
          bad_length = true;
          break;
        }
        const auto d = static_cast<std::uint64_t>(c - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) {
          bad_length = true;
          break;
        }
        v = v * 10 + d;
      }
      if (have_length && v != n) bad_length = true;
      n = v;
      have_length = true;
    }
  }
  if (te > 0) {
    if (has_cl || te > 1 || version < 11 || !iequal(te_value, "chunked")) return ResponseFraming::invalid;
    return ResponseFraming::chunked;
  }
  if (!has_cl) return ResponseFraming::close;
  if (bad_length) return ResponseFraming::invalid;
  *length = n;
  return ResponseFraming::length;
}

ResponseResult parse_response(std::string_view input, std::size_t offset, bool head) {
  ResponseResult res;
  Response& rsp = res.response;
  Reader r(input, offset);
  try {
    // status-line = HTTP-version SP status-code SP [ reason-phrase ]   (RFC 9112 §4)
    // HTTP-version = "HTTP/" DIGIT "." DIGIT; the SP before an empty reason is optional
    // here (a lenient reading: clients ignore the reason).
    const std::string_view l = r.line();
    const auto digit = [](char c) { return c >= '0' && c <= '9'; };
    if (l.size() < 12 || l.substr(0, 5) != "HTTP/" || !digit(l[5]) || l[6] != '.' || !digit(l[7]) ||
        l[8] != ' ' || !digit(l[9]) || !digit(l[10]) || !digit(l[11])) {
      throw Invalid{"malformed status line"};
    }
    rsp.version = (l[5] - '0') * 10 + (l[7] - '0');
    rsp.status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
    if (l.size() > 12) {
      if (l[12] != ' ') throw Invalid{"malformed status line"};
      rsp.reason = std::string(l.substr(13));
      for (const char c : rsp.reason) {
        if (!is_field_char(c)) throw Invalid{"control character in the reason phrase"};
      }
    }
    rsp.fields = r.fields();
    res.header_complete = true;
    res.header_end = r.pos();

    bool close = false;
    bool keep_alive_option = false;
    for (const Field& f : rsp.fields) {
      if (!iequal(f.name, "connection")) continue;
      for (const std::string_view o : list_elements(f.value)) {
        close = close || iequal(o, "close");
        keep_alive_option = keep_alive_option || iequal(o, "keep-alive");
      }
    }
    rsp.keep_alive = !close && (rsp.version >= 11 || keep_alive_option);

    rsp.framing = response_framing_of(rsp.fields, rsp.version, rsp.status, head, &rsp.length);
    switch (rsp.framing) {
      case ResponseFraming::invalid: throw Invalid{"ambiguous or malformed framing"};
      case ResponseFraming::none: break;
      case ResponseFraming::length: rsp.body = std::string(r.bytes(rsp.length)); break;
      case ResponseFraming::chunked: read_chunked(r, rsp); break;
      case ResponseFraming::close: rsp.body = std::string(r.bytes(input.size() - r.pos())); break;
    }
    rsp.end = r.pos();
    res.status = Status::ok;
  } catch (const Incomplete&) {
    res.status = Status::incomplete;
  } catch (const Invalid& e) {
    res.status = Status::invalid;
    res.why = e.why;
  }
  return res;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return out;
}

std::string collapse_ws(std::string_view s) {
  std::string out;
  bool ws = false;
  for (const char c : s) {
    if (c == ' ' || c == '\t') {
      ws = true;
      continue;
    }
    if (ws && !out.empty()) out += ' ';
    ws = false;
    out += c;
  }
  return out;
}

}  // namespace idem::fuzz::ref_http
