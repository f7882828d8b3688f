// Request fingerprint: which parts of a request make it "the same operation", written
// down as one canonical byte string and hashed.
//
// Body model. The body is parsed into an exact tree (json.cpp), then, in this order:
//   1. defaults: for every `defaults` pointer, wherever its parent exists and is an
//      object that lacks the member, the default is inserted ('*' in the middle visits
//      every array element). Parents are never created: {} and {"shipping":{}} stay
//      different bodies in whole-body mode, because a backend would treat them
//      differently too; what we equate is "member omitted" with "member = its default",
//      which is exactly what the backend does with a default. Shorter pointers apply
//      first, so a default object can receive defaults of its own members.
//   2. ignore: every `ignore` pointer is removed. Object members are deleted. Array
//      elements addressed by an index or '*' are replaced by null rather than deleted,
//      so positions of the other elements (and other ignore pointers) do not shift.
//   3. selection: without `fields`, the resulting body is the selection. With `fields`,
//      the selection is the object { pointer text -> selected value }, where a pointer
//      (or, below a '*', one element's continuation of it) that selects nothing takes
//      the pointer's default, else null, and a '*' over an array yields the array of its
//      per-element results. A '*' on anything but an array selects nothing.
// Applying defaults before ignore and both before selection makes the two modes agree:
// an ignored member never counts, and an omitted member with a default counts as the
// default whether or not its parent exists.
//
// Canonical form (what is hashed), each item as <decimal length> ':' <bytes> '\n':
//   "idemproxy-fingerprint/1"          domain tag and version of this layout
//   <fingerprint.version>              the operator's version (bump on config changes)
//   <method> <scope>
//   "fields" | "body"                  selection mode
//   <canonical JSON of the selection>
//   <headers block>                    item(count), then per header sorted by lower-case
//                                      name: item(name), then item("-") if absent or
//                                      item("+") item(OWS-trimmed value) if present
//   "+" <canonical query> | "-"        query included (two items) or not (one item)
// Length prefixes make the concatenation unambiguous: no choice of field contents can
// make two different requests produce the same bytes.
#include "idempotency/fingerprint.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <openssl/evp.h>

#include "idempotency/internal.hpp"
#include "idempotency/key.hpp"

namespace idem::idempotency {

using Pointer = FingerprintSpec::Pointer;

struct FingerprintAccess {
  static const std::string& version(const FingerprintSpec& s) { return s.version_; }
  static const std::optional<std::vector<Pointer>>& fields(const FingerprintSpec& s) {
    return s.fields_;
  }
  static bool fields_disjoint(const FingerprintSpec& s) { return s.fields_disjoint_; }
  static const std::vector<Pointer>& ignore(const FingerprintSpec& s) { return s.ignore_; }
  static const std::vector<std::pair<Pointer, Json>>& defaults(const FingerprintSpec& s) {
    return s.defaults_;
  }
  static const std::optional<std::vector<std::string>>& key_member(const FingerprintSpec& s) {
    return s.key_member_;
  }
  static const std::optional<std::string>& query_key(const FingerprintSpec& s) { return s.query_key_; }
};

namespace {

constexpr std::string_view kFingerprintDomain = "idemproxy-fingerprint/1";
constexpr std::string_view kOperationDomain = "idemproxy-operation-id/1";
constexpr std::string_view kLogHashDomain = "idemproxy-log-hash/1";

// ---------------------------------------------------------------- encoding helpers

void put(std::string& out, std::string_view item) { detail::put_item(out, item); }

char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lower_copy(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), lower);
  return out;
}

bool is_tchar(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// ---------------------------------------------------------------- JSON Pointers

bool is_wildcard(const std::string& seg) noexcept { return seg == "*"; }

std::optional<Pointer> parse_pointer(std::string_view text, std::string* why) {
  auto segments = detail::parse_pointer(text, why);
  if (!segments) return std::nullopt;
  return Pointer{std::string(text), std::move(*segments)};
}

const Json* child(const Json& node, const std::string& seg) { return detail::child_of(node, seg); }

Json* child(Json& node, const std::string& seg) {
  return const_cast<Json*>(child(static_cast<const Json&>(node), seg));
}

void apply_default(Json& node, const std::vector<std::string>& segs, std::size_t i,
                   const Json& value) {
  const std::string& seg = segs[i];
  if (i + 1 == segs.size()) {
    // Only object members can be "omitted"; compile() refuses a trailing '*'.
    if (auto* o = node.as_object(); o != nullptr && o->find(seg) == o->end()) o->emplace(seg, value);
    return;
  }
  if (is_wildcard(seg)) {
    if (auto* a = node.as_array()) {
      for (auto& e : *a) apply_default(e, segs, i + 1, value);
    }
    return;
  }
  if (Json* c = child(node, seg)) apply_default(*c, segs, i + 1, value);
}

void remove_at(Json& node, const std::vector<std::string>& segs, std::size_t i) {
  const std::string& seg = segs[i];
  const bool last = i + 1 == segs.size();
  if (is_wildcard(seg)) {
    if (auto* a = node.as_array()) {
      for (auto& e : *a) {
        if (last) {
          e = Json();
        } else {
          remove_at(e, segs, i + 1);
        }
      }
    }
    return;
  }
  if (!last) {
    if (Json* c = child(node, seg)) remove_at(*c, segs, i + 1);
    return;
  }
  if (auto* o = node.as_object()) {
    o->erase(seg);
  } else if (Json* c = child(node, seg)) {
    *c = Json();  // an array element: keep the other positions stable
  }
}

std::optional<Json> select(const Json& node, const std::vector<std::string>& segs, std::size_t i,
                           const Json& fallback) {
  if (i == segs.size()) return node;
  if (is_wildcard(segs[i])) {
    const auto* a = node.as_array();
    if (a == nullptr) return std::nullopt;
    Json::Array out;
    out.reserve(a->size());
    for (const auto& e : *a) {
      auto v = select(e, segs, i + 1, fallback);
      out.push_back(v ? std::move(*v) : fallback);
    }
    return Json(Json::Value(std::move(out)));
  }
  if (const Json* c = child(node, segs[i])) return select(*c, segs, i + 1, fallback);
  return std::nullopt;
}

// select() on a body the caller owns and reads no more: the selected part is moved out.
// Only for fields that no other field overlaps (fields_disjoint), or a later field would
// find what an earlier one took.
std::optional<Json> take(Json& node, const std::vector<std::string>& segs, std::size_t i,
                         const Json& fallback) {
  if (i == segs.size()) return std::move(node);
  if (is_wildcard(segs[i])) {
    auto* a = node.as_array();
    if (a == nullptr) return std::nullopt;
    Json::Array out;
    out.reserve(a->size());
    for (auto& e : *a) {
      auto v = take(e, segs, i + 1, fallback);
      out.push_back(v ? std::move(*v) : fallback);
    }
    return Json(Json::Value(std::move(out)));
  }
  if (Json* c = child(node, segs[i])) return take(*c, segs, i + 1, fallback);
  return std::nullopt;
}

// Whether two field pointers can reach the same part of a body: one is a prefix of the
// other, a '*' matching any segment.
bool overlap(const Pointer& a, const Pointer& b) {
  const std::size_t n = std::min(a.segments.size(), b.segments.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto& x = a.segments[i];
    const auto& y = b.segments[i];
    if (x != y && !is_wildcard(x) && !is_wildcard(y)) return false;
  }
  return true;
}

// Whether a default at `p` can influence what `field` selects: `p` lies at or below
// `field`. A '*' on either side may stand for any array position.
bool within(const Pointer& field, const Pointer& p) {
  if (field.segments.size() > p.segments.size()) return false;
  for (std::size_t i = 0; i < field.segments.size(); ++i) {
    const auto& f = field.segments[i];
    const auto& q = p.segments[i];
    if (f != q && !is_wildcard(f) && !is_wildcard(q)) return false;
  }
  return true;
}

[[noreturn]] void config_error(const std::string& where, std::string_view pointer,
                               const std::string& why) {
  std::string msg = "fingerprint." + where + " \"";
  msg.append(pointer);
  msg += "\": " + why;
  throw std::invalid_argument(msg);
}

// ---------------------------------------------------------------- body

Json selection(const FingerprintSpec& spec, Json body) {
  // The key's own member is never part of the operation: each retry of one operation may
  // carry a new key only by mistake, but every operation carries a different one.
  if (const auto& key = FingerprintAccess::key_member(spec)) remove_at(body, *key, 0);
  const auto& defaults = FingerprintAccess::defaults(spec);
  for (const auto& [ptr, value] : defaults) apply_default(body, ptr.segments, 0, value);
  for (const auto& ptr : FingerprintAccess::ignore(spec)) remove_at(body, ptr.segments, 0);

  const auto& fields = FingerprintAccess::fields(spec);
  if (!fields) return body;

  static const Json null_value;
  Json::Object out;
  for (const auto& field : *fields) {
    const Json* fallback = &null_value;
    for (const auto& [ptr, value] : defaults) {
      if (ptr.text == field.text) fallback = &value;
    }
    auto v = FingerprintAccess::fields_disjoint(spec) ? take(body, field.segments, 0, *fallback)
                                                      : select(body, field.segments, 0, *fallback);
    out.emplace(field.text, v ? std::move(*v) : *fallback);
  }
  return Json(Json::Value(std::move(out)));
}

// What a form's tree can hold (form.hpp): strings, null, objects and arrays of them.
bool form_typed(const Json& v) {
  if (const auto* a = v.as_array()) return std::all_of(a->begin(), a->end(), form_typed);
  if (const auto* o = v.as_object()) {
    return std::all_of(o->begin(), o->end(), [](const auto& m) { return form_typed(m.second); });
  }
  return v.is_null() || std::holds_alternative<std::string>(v.value());
}

// The settings loader refuses these already; compile() is also called on hand-built settings.
void check_format(const settings::FingerprintSettings& s, const settings::KeySettings& key) {
  if (s.format == settings::BodyFormat::raw) {
    if (s.fields || !s.ignore.empty() || !s.defaults.empty()) {
      throw std::invalid_argument("fingerprint.format: raw hashes the exact bytes: fields, ignore and "
                                  "defaults have no members to select");
    }
    if (key.from == settings::KeySource::body) {
      throw std::invalid_argument("key.from: body needs a body with members; fingerprint.format: raw has none");
    }
  }
  if (!s.media_types.empty() && s.format != settings::BodyFormat::raw) {
    throw std::invalid_argument("fingerprint.media_types needs fingerprint.format: raw");
  }
}

}  // namespace

// ------------------------------------------------------------------- compile

FingerprintSpec FingerprintSpec::compile(const settings::FingerprintSettings& s,
                                         const settings::KeySettings& key) {
  FingerprintSpec spec;
  spec.body_.format = s.format;
  spec.body_.media_types = s.media_types;
  spec.body_.repeated_as_list = s.repeated_names == settings::RepeatedNames::list;
  spec.version_ = s.version;
  std::string why;
  check_format(s, key);
  if (key.from == settings::KeySource::query) spec.query_key_ = key.param;
  if (key.from == settings::KeySource::body) {
    // The member carrying the key is left out of the hash; as a field it would be hashed as
    // null forever, which is the ignore-a-field mistake below.
    auto member = key_member_segments(key.pointer, s.format);
    if (s.fields) {
      for (const auto& text : *s.fields) {
        auto f = parse_pointer(text, &why);
        if (f && f->segments.size() >= member.size() &&
            std::equal(member.begin(), member.end(), f->segments.begin())) {
          config_error("fields", text, "holds the idempotency key (key.pointer \"" + key.pointer +
                                           "\"), which is never part of the fingerprint");
        }
      }
    }
    spec.key_member_ = std::move(member);
  }

  if (s.fields) {
    spec.fields_.emplace();
    for (const auto& text : *s.fields) {
      auto p = parse_pointer(text, &why);
      if (!p) config_error("fields", text, why);
      for (const auto& other : *spec.fields_) {
        if (other.text == text) config_error("fields", text, "listed twice");
      }
      spec.fields_->push_back(std::move(*p));
    }
    const auto& f = *spec.fields_;
    spec.fields_disjoint_ = true;
    for (std::size_t i = 0; i < f.size(); ++i) {
      for (std::size_t j = i + 1; j < f.size(); ++j) {
        if (overlap(f[i], f[j])) spec.fields_disjoint_ = false;
      }
    }
  }

  for (const auto& text : s.ignore) {
    auto p = parse_pointer(text, &why);
    if (!p) config_error("ignore", text, why);
    if (p->segments.empty()) config_error("ignore", text, "cannot ignore the whole body");
    // Ignoring a field (or a parent of one) would pin it to its default/null forever:
    // certainly a configuration mistake, and one that would silently let different
    // requests share a fingerprint.
    if (spec.fields_) {
      for (const auto& f : *spec.fields_) {
        if (f.segments.size() >= p->segments.size() &&
            std::equal(p->segments.begin(), p->segments.end(), f.segments.begin())) {
          config_error("ignore", text, "removes the field \"" + f.text + "\"");
        }
      }
    }
    spec.ignore_.push_back(std::move(*p));
  }

  for (const auto& [text, value_text] : s.defaults) {
    auto p = parse_pointer(text, &why);
    if (!p) config_error("defaults", text, why);
    if (p->segments.empty()) config_error("defaults", text, "the whole body cannot have a default");
    if (is_wildcard(p->segments.back())) {
      config_error("defaults", text, "the last segment cannot be '*' (array elements are never omitted)");
    }
    // A default that no field can see is almost certainly a typo, and a silent one:
    // requests omitting the member would then fingerprint differently from requests
    // spelling out the default.
    if (spec.fields_ && std::none_of(spec.fields_->begin(), spec.fields_->end(),
                                     [&](const Pointer& f) { return within(f, *p); })) {
      config_error("defaults", text, "is neither a field nor inside one, so it would have no effect");
    }
    auto value = parse_json(value_text, &why);
    if (!value) config_error("defaults", text, "value is not valid JSON (" + why + ")");
    // A form holds strings (and null, objects, arrays): a number could never equal what a
    // client sends, so the default would never stand for an omitted member.
    if (s.format == settings::BodyFormat::form && !form_typed(*value)) {
      config_error("defaults", text, "a form body holds strings only: write the default as a string "
                                     "(e.g. \"5\", \"true\")");
    }
    spec.defaults_.emplace_back(std::move(*p), std::move(*value));
  }
  // Parents before children (see the body model above); ties keep the map's text order.
  std::stable_sort(spec.defaults_.begin(), spec.defaults_.end(), [](const auto& a, const auto& b) {
    return a.first.segments.size() < b.first.segments.size();
  });

  for (std::size_t i = 0; i < s.headers.size(); ++i) {
    const std::string& name = s.headers[i];
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_tchar)) {
      throw std::invalid_argument("fingerprint.headers \"" + name + "\": not a valid header name");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (lower_copy(s.headers[j]) == lower_copy(name)) {
        throw std::invalid_argument("fingerprint.headers \"" + name + "\": listed twice");
      }
    }
  }
  spec.header_names_ = s.headers;
  spec.query_ = s.query;
  return spec;
}

// ------------------------------------------------------------------- hashing

std::optional<std::string> canonical_form(const FingerprintSpec& spec, const RequestParts& request,
                                          FingerprintResult* failure) {
  auto parsed = parse_body(spec.body(), request.content_type, request.body);
  if (parsed.status != BodyStatus::ok) {
    if (failure != nullptr) {
      failure->status = parsed.status;
      failure->value.clear();
      failure->reason = std::move(parsed.reason);
    }
    return std::nullopt;
  }
  return canonical_form(spec, request, parsed.body);
}

namespace {

// canonical_form() with the body's model given apart, owned: the selection works on it in
// place (json and form bodies; a raw body has none).
std::string canonical_form_of(const FingerprintSpec& spec, const RequestParts& request,
                              const Body& body, Json model) {
  std::string out;
  out.reserve(256);  // the domain, version, method and scope, and a small body's selection
  put(out, kFingerprintDomain);
  put(out, FingerprintAccess::version(spec));
  put(out, request.method);
  put(out, request.scope);
  // The selection mode, tagged by format: a form's model is hashed in a domain of its own
  // (the JSON layout stays as pinned); a raw body by its media type and bytes.
  switch (body.format) {
    case settings::BodyFormat::json:
      put(out, FingerprintAccess::fields(spec) ? "fields" : "body");
      put(out, canonical_text(selection(spec, std::move(model))));
      break;
    case settings::BodyFormat::form:
      put(out, FingerprintAccess::fields(spec) ? "form:fields" : "form:body");
      put(out, canonical_text(selection(spec, std::move(model))));
      break;
    case settings::BodyFormat::raw:
      put(out, "raw");
      put(out, body.media_type ? std::string_view(*body.media_type) : std::string_view("-"));
      put(out, body.digest);
      break;
  }

  // Sorted by lower-case name so reordering the configured list (or its spelling of
  // case) does not change fingerprints; names are case-insensitive in HTTP.
  const auto& names = spec.header_names();
  std::vector<std::pair<std::string, const std::optional<std::string>*>> headers;
  static const std::optional<std::string> absent;
  for (std::size_t i = 0; i < names.size(); ++i) {
    // A caller that passes fewer values than names gets "absent" for the rest.
    headers.emplace_back(lower_copy(names[i]),
                         i < request.header_values.size() ? &request.header_values[i] : &absent);
  }
  std::sort(headers.begin(), headers.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string block;
  put(block, std::to_string(headers.size()));
  for (const auto& [name, value] : headers) {
    put(block, name);
    if (*value) {
      put(block, "+");
      put(block, detail::trim_ows(**value));
    } else {
      put(block, "-");
    }
  }
  put(out, block);

  if (spec.include_query()) {
    put(out, "+");
    const auto& key = FingerprintAccess::query_key(spec);
    put(out, key ? detail::canonical_query(request.query, *key) : detail::canonical_query(request.query));
  } else {
    put(out, "-");
  }
  return out;
}

}  // namespace

std::string canonical_form(const FingerprintSpec& spec, const RequestParts& request, const Body& body) {
  return canonical_form_of(spec, request, body,
                           body.format == settings::BodyFormat::raw ? Json() : body.model);
}

FingerprintResult fingerprint(const FingerprintSpec& spec, const RequestParts& request) {
  FingerprintResult r;
  auto form = canonical_form(spec, request, &r);
  if (!form) return r;
  r.status = FingerprintStatus::ok;
  r.value = sha256_hex(*form);
  return r;
}

std::string fingerprint(const FingerprintSpec& spec, const RequestParts& request, const Body& body) {
  return sha256_hex(canonical_form(spec, request, body));
}

std::string fingerprint(const FingerprintSpec& spec, const RequestParts& request, Body&& body) {
  Json model = std::move(body.model);
  return sha256_hex(canonical_form_of(spec, request, body, std::move(model)));
}

std::string operation_id(std::string_view tenant, std::string_view scope, std::string_view key) {
  std::string in;
  in.reserve(kOperationDomain.size() + tenant.size() + scope.size() + key.size() + 32);
  put(in, kOperationDomain);
  put(in, tenant);
  put(in, scope);
  put(in, key);
  return sha256_hex(in);
}

std::string log_hash(std::string_view tenant, std::string_view key) {
  // A separate domain tag: the log hash must not be a prefix of anything else we send
  // (operation ids go upstream; logs go to other people).
  std::string in;
  in.reserve(kLogHashDomain.size() + tenant.size() + key.size() + 24);
  put(in, kLogHashDomain);
  put(in, tenant);
  put(in, key);
  return sha256_hex(in).substr(0, 12);
}

void detail::put_item(std::string& out, std::string_view item) {
  char length[24];
  const auto end = std::to_chars(length, length + sizeof length, item.size()).ptr;
  out.append(length, end);
  out.push_back(':');
  out.append(item);
  out.push_back('\n');
}

void sha256(std::string_view data, unsigned char* out) {
  // Fetched once: EVP_sha256() makes every EVP_Digest look the algorithm up in the
  // provider store again (OpenSSL 3's implicit fetch), which cost more than hashing
  // these short inputs (three per protected request). Never freed: it lives as long as
  // the process, and OpenSSL's own cleanup at exit does not need it back.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  // One context per thread, initialised again for each digest: EVP_Digest makes and frees
  // a context (and the provider's state in it) on every call.
  thread_local const std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(),
                                                                          &EVP_MD_CTX_free);
  unsigned int len = 0;
  if (sha256 == nullptr || ctx == nullptr || EVP_DigestInit_ex2(ctx.get(), sha256, nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), out, &len) != 1 || len != 32) {
    // Only a broken OpenSSL installation (no SHA-256 provider) or memory exhaustion
    // gets here. Returning anything would risk equal fingerprints for different
    // requests, i.e. replaying someone else's response; stopping is the safe failure.
    std::fputs("idemproxy: SHA-256 unavailable from OpenSSL, aborting\n", stderr);
    std::abort();
  }
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[32];
  sha256(data, md);
  return text::to_hex(md, sizeof md);
}

}  // namespace idem::idempotency
