// Fuzz target "fingerprint": proxy/idempotency/fingerprint.cpp with the route settings, the
// request parts and the body all chosen by the fuzzer.
//
// Input (FuzzedDataProvider): fingerprint settings (version, fields, ignore, defaults,
// headers, query) from pointer/value vocabularies or raw strings, method, Content-Type,
// header values and query, then the remaining bytes as the body.
// Properties (the body model of proxy/idempotency/README.md, stated as invariants):
//   1. compile() throws nothing but std::invalid_argument.
//   2. The status is the documented one (empty body -> ok; JSON media type; a charset other
//      than utf-8 / us-ascii refused, a non-ASCII body under us-ascii invalid; invalid JSON
//      exactly when the reference parser refuses) and an ok value is 64 lower-case hex equal
//      to SHA-256 of canonical_form().
//   3. Same value, same fingerprint: the body respelled (whitespace, member order, number
//      and string spellings), header values padded with OWS, the header list reordered and
//      re-cased in the settings, the query's parameters reordered and re-escaped.
//   4. Ignored means ignored: replacing or adding a value at any location an ignore pointer
//      addresses leaves the fingerprint unchanged.
//   5. Omitted equals default: writing a default's value where the member is omitted (and its
//      parent exists) leaves the fingerprint unchanged.
//   6. With fields, anything outside every field leaves the fingerprint unchanged.
//   7. Sensitivity: without fields/ignore/defaults, changing any part of the body, the
//      method, or a configured header's value changes the fingerprint.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/idempotency/fingerprint.cpp
// covers: proxy/idempotency/body.cpp
// covers: proxy/idempotency/http_text.cpp
// covers: proxy/idempotency/json.cpp
// covers: proxy/idempotency/number.cpp
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/fingerprint.hpp"
#include "idempotency/internal.hpp"
#include "support/check.hpp"
#include "support/reference_json.hpp"

namespace {

namespace ij = idem::idempotency;
namespace ref = idem::fuzz::ref;
using idem::fuzz::printable;

const char* const kPointers[] = {
    "",         "/a",       "/a/b",          "/b",     "/items", "/items/*", "/items/*/sku", "/items/0",
    "/items/1/sku", "/~0",  "/~1",           "/a~1b",  "/*",     "/*/a",     "/c/-",         "/a/*/b/*",
    "/shipping/address_id", "/currency",     "/amount", "/0",    "/items/*/qty",
};
const char* const kValues[] = {"0", "\"EUR\"", "null", "{}", "[]", "1e3", "{\"x\":1}", "[1,{\"sku\":\"a\"}]", "true"};
const char* const kHeaders[] = {"X-A", "x-b", "Accept", "X-Client"};
const char* const kContentTypes[] = {"application/json", "application/merge-patch+json; charset=utf-8",
                                     " APPLICATION/JSON ", "text/plain", "application/+json",
                                     "application/jsonx", "", "application/json; charset=\"UTF-8\"",
                                     "application/json;charset=us-ascii", "application/json; charset=latin1",
                                     "application/json; q; charset=utf-16"};

std::string pick_pointer(FuzzedDataProvider& fdp) {
  if (fdp.ConsumeIntegralInRange(0, 7) == 0) return fdp.ConsumeRandomLengthString(16);
  return fdp.PickValueInArray(kPointers);
}

// ---------------------------------------------------------------- pointers on ref::Value

std::optional<std::vector<std::string>> segments(std::string_view p) {
  std::vector<std::string> out;
  if (p.empty()) return out;
  if (p.front() != '/') return std::nullopt;
  std::string seg;
  for (std::size_t i = 1; i <= p.size(); ++i) {
    if (i == p.size() || p[i] == '/') {
      out.push_back(seg);
      seg.clear();
    } else if (p[i] == '~') {
      if (i + 1 >= p.size() || (p[i + 1] != '0' && p[i + 1] != '1')) return std::nullopt;
      seg += p[++i] == '0' ? '~' : '/';
    } else {
      seg += p[i];
    }
  }
  return out;
}

// RFC 6901 array index.
std::optional<std::size_t> index_of(const std::string& s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return static_cast<std::size_t>(std::stoul(s));
}

// compile() accepted the pointer, so the reference reading must too.
std::vector<std::string> compiled_segments(const std::string& p) {
  auto s = segments(p);
  IDEM_CHECK(s.has_value(), "compile() accepted the pointer " + printable(p) + ", RFC 6901 does not");
  return *s;
}

ref::Value* member(ref::Value& obj, const std::string& name) {
  for (auto& m : obj.members) {
    if (m.first == name) return &m.second;
  }
  return nullptr;
}

// Calls op(parent, last segment, existing value or nullptr) for every location the pointer
// addresses ('*' = every element of an array, and only of an array). The root pointer
// calls op(nullptr, "", &root).
using Op = std::function<void(ref::Value* parent, const std::string& seg, ref::Value* existing)>;
void visit(ref::Value& node, const std::vector<std::string>& segs, std::size_t i, const Op& op) {
  if (segs.empty()) {
    op(nullptr, "", &node);
    return;
  }
  const std::string& seg = segs[i];
  const bool last = i + 1 == segs.size();
  std::vector<ref::Value*> next;
  if (node.kind == ref::Value::Kind::array) {
    if (seg == "*") {
      for (auto& e : node.items) next.push_back(&e);
    } else if (auto idx = index_of(seg); idx && *idx < node.items.size()) {
      next.push_back(&node.items[*idx]);
    }
  } else if (node.kind == ref::Value::Kind::object && seg != "*") {
    ref::Value* m = member(node, seg);
    if (last) {
      op(&node, seg, m);
      return;
    }
    if (m != nullptr) next.push_back(m);
  }
  for (ref::Value* n : next) {
    if (last) {
      op(&node, seg, n);
    } else {
      visit(*n, segs, i + 1, op);
    }
  }
}

ref::Value marker() {
  return *ref::parse(R"({"__fuzz_marker__":[1,"x"]})");
}

// Every location in the tree as a concrete path (member names / decimal indexes), preorder.
void all_paths(const ref::Value& v, std::vector<std::string>& path, std::vector<std::vector<std::string>>& out) {
  out.push_back(path);
  if (out.size() > 256) return;
  if (v.kind == ref::Value::Kind::array) {
    for (std::size_t i = 0; i < v.items.size(); ++i) {
      path.push_back(std::to_string(i));
      all_paths(v.items[i], path, out);
      path.pop_back();
    }
  } else if (v.kind == ref::Value::Kind::object) {
    for (const auto& m : v.members) {
      path.push_back(m.first);
      all_paths(m.second, path, out);
      path.pop_back();
    }
  }
}

ref::Value* at_path(ref::Value& v, const std::vector<std::string>& path) {
  ref::Value* cur = &v;
  for (const auto& seg : path) {
    if (cur->kind == ref::Value::Kind::array) {
      cur = &cur->items[std::stoul(seg)];
    } else {
      cur = member(*cur, seg);
    }
  }
  return cur;
}

// Conservative: '*' in the field may match anything, so "related" errs towards true.
bool related(const std::vector<std::string>& field, const std::vector<std::string>& path) {
  const std::size_t n = std::min(field.size(), path.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (field[i] != "*" && field[i] != path[i]) return false;
  }
  return true;  // one is a prefix of the other
}

// ---------------------------------------------------------------- query spellings

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string form_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      out += static_cast<char>(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void form_encode(std::string& out, std::string_view s, std::mt19937_64& rng) {
  static constexpr char kLower[] = "0123456789abcdef";
  static constexpr char kUpper[] = "0123456789ABCDEF";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                            c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved && rng() % 3 != 0) {
      out += c;
    } else if (c == ' ' && rng() % 2 == 0) {
      out += '+';
    } else {
      const char* hex = rng() % 2 ? kLower : kUpper;
      out += '%';
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
}

// The same parameters, decoded and written again in another order and spelling.
std::string respell_query(std::string_view raw, std::mt19937_64& rng) {
  std::vector<std::pair<std::string, std::string>> params;
  std::size_t pos = 0;
  while (pos <= raw.size()) {
    std::size_t amp = raw.find('&', pos);
    if (amp == std::string_view::npos) amp = raw.size();
    const std::string_view part = raw.substr(pos, amp - pos);
    pos = amp + 1;
    if (part.empty()) continue;
    const std::size_t eq = part.find('=');
    params.emplace_back(form_decode(part.substr(0, eq)),
                        eq == std::string_view::npos ? "" : form_decode(part.substr(eq + 1)));
  }
  std::shuffle(params.begin(), params.end(), rng);
  std::string out;
  for (const auto& [name, value] : params) {
    if (rng() % 4 == 0) out += '&';
    if (!out.empty()) out += '&';
    form_encode(out, name, rng);
    // "a" and "a=" are the same parameter, but "" is no parameter at all while "=" is one.
    if (!value.empty() || name.empty() || rng() % 2) {
      out += '=';
      form_encode(out, value, rng);
    }
  }
  return out;
}

// ---------------------------------------------------------------- the target

struct Case {
  idem::settings::FingerprintSettings settings;
  std::string method;
  std::optional<std::string> content_type;
  std::vector<std::optional<std::string>> header_values;
  std::string query;
  std::string body;
};

ij::RequestParts parts(const Case& c, const std::string& body) {
  ij::RequestParts p;
  p.method = c.method;
  p.scope = "POST /orders";
  if (c.content_type) p.content_type = *c.content_type;
  p.body = body;
  p.header_values = c.header_values;
  p.query = c.query;
  return p;
}

bool json_media(std::string_view ct) {
  // docs: application/json or application/<x>+json, case-insensitive, parameters ignored,
  // surrounding OWS tolerated. Compared through lower-casing here.
  std::string mt(ct.substr(0, ct.find(';')));
  while (!mt.empty() && (mt.front() == ' ' || mt.front() == '\t')) mt.erase(0, 1);
  while (!mt.empty() && (mt.back() == ' ' || mt.back() == '\t')) mt.pop_back();
  for (auto& ch : mt) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (mt.rfind("application/", 0) != 0) return false;
  const std::string sub = mt.substr(12);
  auto token = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) ||
             std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
    });
  };
  if (!token(sub)) return false;
  return sub == "json" || (sub.size() > 5 && sub.compare(sub.size() - 5, 5, "+json") == 0);
}

// docs: a charset parameter (name case-insensitive, value unquoted and case-insensitive) must
// be utf-8 or us-ascii; the first parameter named charset counts, malformed ones are passed
// over. Returns the lower-cased value, "" when there is none.
std::string charset_of(std::string_view ct) {
  std::string lower(ct);
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::size_t at = lower.find(';');
  while (at != std::string::npos) {
    const std::size_t next = lower.find(';', at + 1);
    std::string param = lower.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    at = next;
    const auto trim = [](std::string& t) {
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(0, 1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    };
    const std::size_t eq = param.find('=');
    if (eq == std::string::npos) continue;
    std::string name = param.substr(0, eq);
    std::string value = param.substr(eq + 1);
    trim(name);
    trim(value);
    if (name != "charset") continue;
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    return value.empty() ? std::string("(empty)") : value;
  }
  return "";
}

// One fuzz case: the spec compiled from its settings, the fingerprint of the request as
// given, and one method per property, each comparing against that fingerprint.
class Checker {
 public:
  Checker(const Case& c, ij::FingerprintSpec spec)
      : c_(c), spec_(std::move(spec)), r_(ij::fingerprint(spec_, parts(c, c.body))),
        rng_(std::hash<std::string>{}(c.body) ^ c.query.size()) {}

  // Property 2; false when there is nothing more to check (a refused request).
  bool status() {
    if (c_.body.empty()) {
      IDEM_CHECK(r_.status == ij::FingerprintStatus::ok, "an empty body must fingerprint: " + r_.reason);
    } else if (!c_.content_type || !json_media(*c_.content_type)) {
      IDEM_CHECK(r_.status == ij::FingerprintStatus::unsupported_media_type,
                 "Content-Type " + printable(c_.content_type.value_or("(none)")) + " must be refused");
      return false;
    } else if (const auto cs = charset_of(*c_.content_type); !cs.empty() && cs != "utf-8" && cs != "us-ascii") {
      IDEM_CHECK(r_.status == ij::FingerprintStatus::unsupported_charset,
                 "charset " + printable(cs) + " must be refused");
      return false;
    } else if (cs == "us-ascii" && std::any_of(c_.body.begin(), c_.body.end(),
                                               [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; })) {
      IDEM_CHECK(r_.status == ij::FingerprintStatus::invalid_json, "a non-ASCII body under us-ascii must be refused");
      return false;
    } else {
      body_ = ref::parse(c_.body);
      IDEM_CHECK((r_.status == ij::FingerprintStatus::invalid_json) == !body_.has_value(),
                 "invalid_json disagrees with the reference parser for " + printable(c_.body));
      if (!body_) return false;
    }
    IDEM_CHECK(r_.status == ij::FingerprintStatus::ok, "status not ok: " + r_.reason);
    IDEM_CHECK(r_.value.size() == 64 && std::all_of(r_.value.begin(), r_.value.end(), [](char ch) {
                 return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
               }),
               "fingerprint is not 64 lower-case hex: " + printable(r_.value));
    ij::FingerprintResult failure;
    const auto form = ij::canonical_form(spec_, parts(c_, c_.body), &failure);
    IDEM_CHECK(form && ij::sha256_hex(*form) == r_.value, "fingerprint is not SHA-256 of canonical_form");
    return true;
  }

  // Property 3.
  void spellings() {
    if (body_) {
      // Under charset=us-ascii a respelling that writes an escape as its UTF-8 bytes is
      // another (refused) body; only ASCII respellings are the same one.
      const auto respelled = ref::respell(*body_, rng_);
      const bool ascii = charset_of(c_.content_type.value_or("")) == "us-ascii";
      if (!ascii || std::none_of(respelled.begin(), respelled.end(),
                                 [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; })) {
        same_as(respelled, "respelling the body");
      }
    }
    Case padded = c_;
    for (auto& v : padded.header_values) {
      if (v) *v = " \t" + *v + "  ";
    }
    padded.query = respell_query(c_.query, rng_);
    Case reordered = padded;
    std::vector<std::size_t> order(c_.settings.headers.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    for (std::size_t i = 0; i < order.size(); ++i) {
      std::string name = c_.settings.headers[order[i]];
      for (auto& ch : name) {
        const auto u = static_cast<unsigned char>(ch);
        ch = static_cast<char>(rng_() % 2 ? std::toupper(u) : std::tolower(u));
      }
      reordered.settings.headers[i] = name;
      reordered.header_values[i] = padded.header_values[order[i]];
    }
    const auto spec2 = ij::FingerprintSpec::compile(reordered.settings);
    const ij::FingerprintResult o = ij::fingerprint(spec2, parts(reordered, c_.body));
    IDEM_CHECK(o.status == ij::FingerprintStatus::ok && o.value == r_.value,
               "OWS, header order/case or query spelling changed the fingerprint (query " +
                   printable(c_.query) + " -> " + printable(reordered.query) + ")");
  }

  // Property 4.
  void ignored() {
    if (!body_) return;
    for (const auto& text : c_.settings.ignore) {
      ref::Value changed = *body_;
      visit(changed, compiled_segments(text), 0, [](ref::Value* parent, const std::string& seg, ref::Value* existing) {
        if (existing != nullptr) {
          *existing = marker();
        } else if (parent != nullptr && parent->kind == ref::Value::Kind::object && ref::valid_utf8(seg)) {
          // A member name that is not UTF-8 cannot be written in a JSON body (the
          // respeller once looped on one).
          parent->members.push_back(ref::Member{seg, marker()});
        }
      });
      same_as(ref::respell(changed, rng_), "changing an ignored location");
    }
  }

  // Property 5.
  void defaults() {
    if (!body_) return;
    for (const auto& [text, value_text] : c_.settings.defaults) {
      const auto value = ref::parse(value_text);
      if (!value) continue;
      ref::Value explicit_body = *body_;
      visit(explicit_body, compiled_segments(text), 0,
            [&](ref::Value* parent, const std::string& seg, ref::Value* existing) {
              if (existing == nullptr && parent != nullptr && parent->kind == ref::Value::Kind::object &&
                  ref::valid_utf8(seg)) {  // as in ignored()
                parent->members.push_back(ref::Member{seg, *value});
              }
            });
      same_as(ref::respell(explicit_body, rng_), "writing out a default");
    }
  }

  // Property 6: the first location outside every field.
  void outside_fields() {
    if (!body_ || !c_.settings.fields) return;
    std::vector<std::vector<std::string>> field_segs;
    for (const auto& f : *c_.settings.fields) field_segs.push_back(compiled_segments(f));
    for (const auto& p : paths()) {
      if (std::any_of(field_segs.begin(), field_segs.end(), [&](const auto& f) { return related(f, p); })) {
        continue;
      }
      ref::Value changed = *body_;
      *at_path(changed, p) = marker();
      same_as(ref::respell(changed, rng_), "changing a location outside every field");
      return;
    }
  }

  // Property 7, where the whole body counts.
  void sensitivity() {
    if (!body_ || c_.settings.fields || !c_.settings.ignore.empty() || !c_.settings.defaults.empty()) return;
    const auto all = paths();
    const auto& p = all[rng_() % all.size()];
    ref::Value changed = *body_;
    ref::Value* at = at_path(changed, p);
    if (ref::canonical(*at) != ref::canonical(marker())) {
      *at = marker();
      const std::string other = ref::respell(changed, rng_);
      const ij::FingerprintResult o = ij::fingerprint(spec_, parts(c_, other));
      IDEM_CHECK(o.status == ij::FingerprintStatus::ok && o.value != r_.value,
                 "a different body kept the fingerprint: " + printable(c_.body) + " vs " + printable(other));
    }
    Case other_method = c_;
    other_method.method += "X";
    IDEM_CHECK(ij::fingerprint(spec_, parts(other_method, c_.body)).value != r_.value, "the method is not covered");
    for (std::size_t i = 0; i < c_.header_values.size(); ++i) {
      Case other = c_;
      other.header_values[i] = c_.header_values[i] ? std::optional<std::string>() : std::optional<std::string>("");
      IDEM_CHECK(ij::fingerprint(spec_, parts(other, c_.body)).value != r_.value,
                 "absent vs present header " + c_.settings.headers[i] + " is not covered");
      if (c_.header_values[i]) {
        other.header_values[i] = *c_.header_values[i] + "x";
        IDEM_CHECK(ij::fingerprint(spec_, parts(other, c_.body)).value != r_.value,
                   "the value of header " + c_.settings.headers[i] + " is not covered");
      }
    }
  }

 private:
  void same_as(const std::string& other_body, const char* what) {
    const ij::FingerprintResult o = ij::fingerprint(spec_, parts(c_, other_body));
    IDEM_CHECK(o.status == ij::FingerprintStatus::ok && o.value == r_.value,
               std::string(what) + " changed the fingerprint: " + printable(c_.body) + " -> " +
                   printable(other_body));
  }

  std::vector<std::vector<std::string>> paths() const {
    std::vector<std::string> path;
    std::vector<std::vector<std::string>> out;
    all_paths(*body_, path, out);
    return out;
  }

  const Case& c_;
  ij::FingerprintSpec spec_;
  ij::FingerprintResult r_;
  std::optional<ref::Value> body_;  // parsed by the reference; empty body: none
  std::mt19937_64 rng_;
};

void run(const Case& c) {
  std::optional<ij::FingerprintSpec> spec;
  try {
    spec = ij::FingerprintSpec::compile(c.settings);
  } catch (const std::invalid_argument&) {
    return;  // a configuration error, reported at load time
  }
  Checker check(c, std::move(*spec));
  if (!check.status()) return;
  check.spellings();
  check.ignored();
  check.defaults();
  check.outside_fields();
  check.sensitivity();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Case c;
  auto& s = c.settings;
  s.version = fdp.ConsumeRandomLengthString(8);
  if (fdp.ConsumeBool()) {
    s.fields.emplace();
    for (int n = fdp.ConsumeIntegralInRange(0, 3); n > 0; --n) s.fields->push_back(pick_pointer(fdp));
  }
  for (int n = fdp.ConsumeIntegralInRange(0, 2); n > 0; --n) s.ignore.push_back(pick_pointer(fdp));
  for (int n = fdp.ConsumeIntegralInRange(0, 2); n > 0; --n) {
    std::string p = pick_pointer(fdp);
    s.defaults[p] = fdp.ConsumeBool() ? fdp.PickValueInArray(kValues) : fdp.ConsumeRandomLengthString(16);
  }
  for (int n = fdp.ConsumeIntegralInRange(0, 2); n > 0; --n) {
    s.headers.push_back(fdp.ConsumeBool() ? fdp.PickValueInArray(kHeaders) : fdp.ConsumeRandomLengthString(8));
    c.header_values.push_back(fdp.ConsumeBool() ? std::optional<std::string>(fdp.ConsumeRandomLengthString(16))
                                                : std::nullopt);
  }
  s.query = fdp.ConsumeBool();
  c.method = fdp.ConsumeBool() ? "POST" : "PUT";
  if (fdp.ConsumeIntegralInRange(0, 7) != 0) {
    c.content_type = fdp.ConsumeIntegralInRange(0, 3) != 0 ? std::string(kContentTypes[0])
                                                           : std::string(fdp.PickValueInArray(kContentTypes));
  }
  c.query = fdp.ConsumeRandomLengthString(32);
  c.body = fdp.ConsumeRemainingBytesAsString();
  run(c);
  return 0;
}
