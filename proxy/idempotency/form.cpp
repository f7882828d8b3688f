// application/x-www-form-urlencoded into the shared body tree.
//
// Reading, in the order Rack's QueryParser does it (and Stripe, which reads its API's
// bodies the same way, with numbered array elements):
//   1. split on '&' (never ';'), dropping empty parts; at most max_params remain;
//   2. split each part at its first '=': name and value; no '=' means a value-less
//      parameter (null, as Rack reads it), "a=" an empty string;
//   3. decode both: '+' is a space, %XX a byte; then the bytes must be UTF-8;
//   4. split the decoded name: the name up to its first '[' after the first character,
//      then bracketed keys, "[]" meaning "append to the array";
//   5. insert the value at that path (the rules below);
//   6. turn every object whose keys are exactly "0".."n-1" into the array of its values,
//      so items[0][sku] and items[1][sku] read as the array Stripe means.
//
// Insertion, with Rack's one subtle rule for arrays of objects: a[][x]=1&a[][y]=2 is one
// element {x, y}; a[][x]=1&a[][x]=2 two. A path continues in the array's last element
// when that is an object which does not have the path yet, and starts a new element
// otherwise.
//
// Refused (400 invalid_form), where Rack guesses or readers disagree:
//   - a %-escape that is not %XX with hex digits (Rack 3 refuses it too);
//   - names or values that are not UTF-8 (or not US-ASCII under charset=us-ascii);
//   - an empty name ("=x", "[a]" is the literal name "[a]" as Rack reads it);
//   - brackets that do not close, or text after a ']' ("a[b", "a[b]c": Rack reads the
//     latter as a[b][c], other parsers as the key "b]c");
//   - one name used for a value and for nested parameters, or for an array and an object
//     ("a=1&a[b]=2", "a[]=1&a[b]=2": Rack raises, or keeps whichever came last);
//   - a repeated name ("a=1&a=2": first wins in Go's FormValue, last in Rack and PHP, a
//     list in Django's getlist), unless repeated_as_list: then the values form a list;
//   - more than max_params parameters or max_depth levels (bounded work per request).
#include "idempotency/form.hpp"

#include "common/text.hpp"
#include "idempotency/internal.hpp"

namespace idem::idempotency {

namespace {

// One level of a parameter's name: a key, or "[]" (append).
struct Segment {
  std::string key;
  bool append = false;
};

class Reader {
 public:
  explicit Reader(const FormOptions& options) : options_(options), root_(Json::Object{}) {}

  bool add(std::string_view part);
  Json finish();
  const std::string& error() const noexcept { return error_; }

 private:
  bool fail(const char* why) {
    error_ = why;
    return false;
  }
  bool decode(std::string_view in, std::string& out);
  bool split(const std::string& name, std::vector<Segment>& path);
  bool insert(Json::Object& object, const std::vector<Segment>& path, std::size_t i, Json leaf);
  bool append(Json::Array& array, const std::vector<Segment>& path, std::size_t i, Json leaf);
  bool repeat(Json& existing, Json leaf);

  const FormOptions& options_;
  Json root_;
  std::size_t params_ = 0;
  std::string error_;
};

// '+' is a space and %XX a byte; any other '%' is refused: "%zz" kept literally by one
// reader and refused by the next would be two requests.
bool Reader::decode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%') {
      const int byte = text::percent_byte(in, i);
      if (byte < 0) return fail("a '%' that is not followed by two hex digits");
      out.push_back(static_cast<char>(byte));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  if (options_.ascii_only) {
    for (const char c : out) {
      if (static_cast<unsigned char>(c) >= 0x80) return fail("a byte outside US-ASCII, which the charset says it is");
    }
  }
  if (!detail::is_valid_utf8(out)) return fail("a name or value that is not UTF-8");
  return true;
}

// The name up to the first '[' after its first character (so "[a]" and "[]" are plain
// names, as Rack reads them), then groups "[key]" or "[]" and nothing else.
bool Reader::split(const std::string& name, std::vector<Segment>& path) {
  path.clear();
  if (name.empty()) return fail("a parameter without a name");
  const std::size_t open = name.find('[', 1);
  path.push_back({name.substr(0, open), false});
  for (std::size_t i = open; i != std::string::npos && i < name.size();) {
    if (name[i] != '[') return fail("text after ']' in a parameter name");
    const std::size_t close = name.find(']', i + 1);
    if (close == std::string::npos) return fail("a '[' without ']' in a parameter name");
    const std::string_view key(name.data() + i + 1, close - i - 1);
    if (key.find('[') != std::string_view::npos) return fail("a '[' inside brackets in a parameter name");
    path.push_back({std::string(key), key.empty()});
    if (path.size() > options_.limits.max_depth) return fail("a parameter name nested too deep");
    i = close + 1;
  }
  return true;
}

bool Reader::add(std::string_view part) {
  if (part.empty()) return true;  // "a=1&&b=2", a trailing '&'
  if (++params_ > options_.limits.max_params) return fail("more parameters than the limit");
  const std::size_t eq = part.find('=');
  std::string name;
  if (!decode(part.substr(0, eq), name)) return false;
  Json leaf;  // null: a parameter without '='
  if (eq != std::string_view::npos) {
    std::string value;
    if (!decode(part.substr(eq + 1), value)) return false;
    leaf = Json(Json::Value(std::move(value)));
  }
  std::vector<Segment> path;
  if (!split(name, path)) return false;
  return insert(*root_.as_object(), path, 0, std::move(leaf));
}

// A value written where one is already: a list when the route reads repeated names as
// one, refused otherwise (and always when containers are involved).
bool Reader::repeat(Json& existing, Json leaf) {
  if (!options_.repeated_as_list) return fail("a repeated parameter name (fingerprint.repeated_names: reject)");
  if (existing.as_object() != nullptr) return fail("a name used both for a value and for nested parameters");
  if (auto* list = existing.as_array()) {
    for (const auto& e : *list) {
      if (e.as_array() != nullptr || e.as_object() != nullptr) {
        return fail("a name used both for a value and for nested parameters");
      }
    }
    list->push_back(std::move(leaf));
    return true;
  }
  Json::Array list;
  list.push_back(std::move(existing));
  list.push_back(std::move(leaf));
  existing = Json(Json::Value(std::move(list)));
  return true;
}

// path[i] is a key of `object`.
bool Reader::insert(Json::Object& object, const std::vector<Segment>& path, std::size_t i, Json leaf) {
  const std::string& key = path[i].key;
  auto it = object.find(key);
  if (i + 1 == path.size()) {
    if (it == object.end()) {
      object.emplace(key, std::move(leaf));
      return true;
    }
    return repeat(it->second, std::move(leaf));
  }
  const bool wants_array = path[i + 1].append;
  if (it == object.end()) {
    it = object.emplace(key, wants_array ? Json(Json::Value(Json::Array{})) : Json(Json::Value(Json::Object{}))).first;
  }
  if (wants_array) {
    auto* array = it->second.as_array();
    if (array == nullptr) return fail("a name used both for an array and for something else");
    return append(*array, path, i + 1, std::move(leaf));
  }
  auto* child = it->second.as_object();
  if (child == nullptr) return fail("a name used both for a value and for nested parameters");
  return insert(*child, path, i + 1, std::move(leaf));
}

// Whether `object` already has what path[i..] names, read as Rack's params_hash_has_key?
// reads it: every key must exist, each in the object its predecessor names, and "[]" levels
// are passed over (so a[][tags][]=x twice makes two elements, as in Rack).
bool has_path(const Json::Object& object, const std::vector<Segment>& path, std::size_t i) {
  const Json* at = nullptr;
  const Json::Object* in = &object;
  for (; i < path.size(); ++i) {
    if (path[i].append) continue;
    if (at != nullptr) in = at->as_object();
    if (in == nullptr) return false;
    const auto it = in->find(path[i].key);
    if (it == in->end()) return false;
    at = &it->second;
  }
  return true;
}

// path[i] is the "[]" of `array`.
bool Reader::append(Json::Array& array, const std::vector<Segment>& path, std::size_t i, Json leaf) {
  if (i + 1 == path.size()) {
    array.push_back(std::move(leaf));
    return true;
  }
  if (path[i + 1].append) {  // a[][]=x: a new inner array per parameter, as Rack builds it
    array.emplace_back();  // as below
    array.back() = Json(Json::Value(Json::Array{}));
    return append(*array.back().as_array(), path, i + 1, std::move(leaf));
  }
  auto* last = array.empty() ? nullptr : array.back().as_object();
  if (last == nullptr || has_path(*last, path, i + 1)) {
    // Grown first, then given its value: pushing the temporary trips a GCC 12
    // -Wmaybe-uninitialized false positive inside std::variant.
    array.emplace_back();
    array.back() = Json(Json::Value(Json::Object{}));
    last = array.back().as_object();
  }
  return insert(*last, path, i + 1, std::move(leaf));
}

// "0", "1", ..., without leading zeros: an index Stripe's items[0] writes.
bool is_index(const std::string& key, std::size_t below) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key.front() == '0')) return false;
  std::size_t n = 0;
  for (const char c : key) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  return n < below;
}

// Objects keyed exactly 0..n-1 become arrays, below the root (a form is always an object).
// Every key is a distinct index below n, so there are n of them: the indexes are all there.
void arrays_from_indexes(Json& node, bool root) {
  if (auto* array = node.as_array()) {
    for (auto& e : *array) arrays_from_indexes(e, false);
    return;
  }
  auto* object = node.as_object();
  if (object == nullptr) return;
  for (auto& [key, value] : *object) arrays_from_indexes(value, false);
  if (root || object->empty()) return;
  for (const auto& [key, value] : *object) {
    if (!is_index(key, object->size())) return;
  }
  Json::Array array(object->size());
  for (auto& [key, value] : *object) array[std::stoul(key)] = std::move(value);
  node = Json(Json::Value(std::move(array)));
}

Json Reader::finish() {
  arrays_from_indexes(root_, true);
  return std::move(root_);
}

}  // namespace

std::optional<Json> parse_form(std::string_view body, const FormOptions& options, std::string* error) {
  Reader reader(options);
  std::size_t pos = 0;
  while (pos <= body.size()) {
    std::size_t amp = body.find('&', pos);
    if (amp == std::string_view::npos) amp = body.size();
    if (!reader.add(body.substr(pos, amp - pos))) {
      if (error != nullptr) *error = "invalid form: " + reader.error();
      return std::nullopt;
    }
    pos = amp + 1;
  }
  return reader.finish();
}

std::optional<std::vector<std::string>> form_field_path(std::string_view path) {
  std::vector<std::string> out;
  if (path.empty() || path.find_first_of("&=%+") != std::string_view::npos) return std::nullopt;
  // The same splitting as a parameter's name; "[]" names no one value.
  std::size_t open = path.find('[', 1);
  out.emplace_back(path.substr(0, open));
  for (std::size_t i = open; i != std::string_view::npos && i < path.size();) {
    const std::size_t close = path.find(']', i + 1);
    if (path[i] != '[' || close == std::string_view::npos || close == i + 1) return std::nullopt;
    const auto key = path.substr(i + 1, close - i - 1);
    if (key.find('[') != std::string_view::npos) return std::nullopt;
    out.emplace_back(key);
    i = close + 1;
  }
  return out;
}

}  // namespace idem::idempotency
