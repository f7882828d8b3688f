// Reference form reader: see reference_form.hpp. The recursion follows Rack 3's
// normalize_params(params, name, v, depth) line by line, on a ref::Value tree; where the
// documented rules are stricter than Rack (malformed brackets, repeated names, conflicting
// shapes, escapes, UTF-8) it refuses instead of guessing, and numbered objects become
// arrays in a pass of their own at the end.
#include "support/reference_form.hpp"

#include <algorithm>
#include <vector>

namespace idem::fuzz::ref {

namespace {

struct Refused {};

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Value string_value(std::string s) {
  Value v;
  v.kind = Value::Kind::string;
  v.text = std::move(s);
  return v;
}

Value container(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}

Value* member(Value& object, const std::string& name) {
  for (auto& m : object.members) {
    if (m.first == name) return &m.second;
  }
  return nullptr;
}

bool is_leaf(const Value& v) { return v.kind == Value::Kind::string || v.kind == Value::Kind::null; }

class Normalizer {
 public:
  explicit Normalizer(const FormRules& rules) : rules_(rules) {}

  // params[k] = v, with the documented rule for a name that is already there.
  void assign(Value& params, const std::string& k, Value v) {
    Value* existing = member(params, k);
    if (existing == nullptr) {
      params.members.push_back({k, std::move(v)});
      return;
    }
    if (!rules_.repeated_as_list) throw Refused{};
    if (is_leaf(*existing)) {
      Value list = container(Value::Kind::array);
      list.items.push_back(std::move(*existing));
      list.items.push_back(std::move(v));
      *existing = std::move(list);
      return;
    }
    if (existing->kind != Value::Kind::array ||
        !std::all_of(existing->items.begin(), existing->items.end(), is_leaf)) {
      throw Refused{};
    }
    existing->items.push_back(std::move(v));
  }

  // params[k] ||= [] / {} and its type check.
  Value& slot(Value& params, const std::string& k, Value::Kind kind) {
    if (Value* existing = member(params, k)) {
      if (existing->kind != kind) throw Refused{};
      return *existing;
    }
    params.members.push_back({k, container(kind)});
    return params.members.back().second;
  }

  // Rack's params_hash_has_key?: the name split on runs of brackets, empty parts skipped,
  // each part a key of the hash the previous one named.
  static bool has_key(const Value& hash, const std::string& key) {
    const Value* h = &hash;
    std::string part;
    const auto step = [&]() {
      if (part.empty()) return true;
      if (h->kind != Value::Kind::object) return false;
      const Value* next = nullptr;
      for (const auto& m : h->members) {
        if (m.first == part) next = &m.second;
      }
      part.clear();
      if (next == nullptr) return false;
      h = next;
      return true;
    };
    for (const char c : key) {
      if (c == '[' || c == ']') {
        if (!step()) return false;
      } else {
        part.push_back(c);
      }
    }
    return step();
  }

  // Returns the value to put where the caller wants it (Rack returns params, or [v]).
  Value normalize(Value params, const std::string& name, Value v, int depth) {
    std::string k;
    std::string after;
    if (depth == 0) {
      const auto start = name.find('[', 1);
      if (name.empty()) throw Refused{};  // documented: a parameter without a name
      if (start == std::string::npos) {
        k = name;
      } else {
        k = name.substr(0, start);
        after = name.substr(start);
      }
    } else if (name.rfind("[]", 0) == 0) {
      k = "[]";
      after = name.substr(2);
    } else if (!name.empty() && name[0] == '[' && name.find(']', 1) != std::string::npos) {
      const auto close = name.find(']', 1);
      k = name.substr(1, close - 1);
      after = name.substr(close + 1);
      if (k.find('[') != std::string::npos) throw Refused{};  // "[[b]]"
    } else {
      throw Refused{};  // documented: text after ']', or a '[' without ']'
    }

    if (after.empty()) {
      if (k == "[]" && depth != 0) {
        Value list = container(Value::Kind::array);
        list.items.push_back(std::move(v));
        return list;
      }
      assign(params, k, std::move(v));
    } else if (after == "[]") {
      slot(params, k, Value::Kind::array).items.push_back(std::move(v));
    } else if (after.rfind("[]", 0) == 0) {
      // Unlike Rack, the child is always passed in bracket form ("[x]", "[x][y]", "[]..."),
      // so that a depth > 0 name never needs Rack's fallback for plain names.
      const std::string child = after.substr(2);
      Value& list = slot(params, k, Value::Kind::array);
      if (child[0] == '[' && child.rfind("[]", 0) != 0 && !list.items.empty() &&
          list.items.back().kind == Value::Kind::object && !has_key(list.items.back(), child)) {
        Value last = std::move(list.items.back());
        list.items.back() = normalize(std::move(last), child, std::move(v), depth + 1);
      } else if (child.rfind("[]", 0) == 0) {
        // Documented: a[][]=x makes a new inner array per parameter.
        Value inner = container(Value::Kind::array);
        list.items.push_back(append_into(std::move(inner), child, std::move(v), depth + 1));
      } else {
        list.items.push_back(normalize(container(Value::Kind::object), child, std::move(v), depth + 1));
      }
    } else {
      Value& child = slot(params, k, Value::Kind::object);
      child = normalize(std::move(child), after, std::move(v), depth + 1);
    }
    return params;
  }

  // `name` starts with "[]" and `array` is the array it appends to (nested arrays).
  Value append_into(Value array, const std::string& name, Value v, int depth) {
    const std::string rest = name.substr(2);
    if (rest.empty()) {
      array.items.push_back(std::move(v));
      return array;
    }
    if (rest.rfind("[]", 0) == 0) {
      array.items.push_back(append_into(container(Value::Kind::array), rest, std::move(v), depth + 1));
      return array;
    }
    // rest is "[key]...": the same continue-or-start rule as in normalize.
    if (!array.items.empty() && array.items.back().kind == Value::Kind::object &&
        !has_key(array.items.back(), rest)) {
      Value last = std::move(array.items.back());
      array.items.back() = normalize(std::move(last), rest, std::move(v), depth + 1);
    } else {
      array.items.push_back(normalize(container(Value::Kind::object), rest, std::move(v), depth + 1));
    }
    return array;
  }

 private:
  const FormRules& rules_;
};

// Bracket groups of a decoded name after its top name: "a[x][]" has 2.
std::size_t groups(const std::string& name) {
  const auto start = name.find('[', 1);
  if (start == std::string::npos) return 0;
  return static_cast<std::size_t>(std::count(name.begin() + static_cast<std::ptrdiff_t>(start), name.end(), '['));
}

bool canonical_index(const std::string& k) {
  return !k.empty() && k.size() <= 10 && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         (k.size() == 1 || k[0] != '0');
}

// Objects (below the root) keyed by every number 0..n-1 and nothing else become arrays.
void numbered_to_arrays(Value& v, bool root) {
  for (auto& item : v.items) numbered_to_arrays(item, false);
  for (auto& m : v.members) numbered_to_arrays(m.second, false);
  if (root || v.kind != Value::Kind::object || v.members.empty()) return;
  std::vector<std::pair<unsigned long, Value*>> numbered;
  for (auto& m : v.members) {
    if (!canonical_index(m.first)) return;
    numbered.emplace_back(std::stoul(m.first), &m.second);
  }
  std::sort(numbered.begin(), numbered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < numbered.size(); ++i) {
    if (numbered[i].first != i) return;
  }
  Value array = container(Value::Kind::array);
  for (auto& [index, value] : numbered) array.items.push_back(std::move(*value));
  v = std::move(array);
}

}  // namespace

std::optional<std::string> form_decode(std::string_view raw) {
  std::string out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '+') {
      out += ' ';
    } else if (raw[i] == '%') {
      const int hi = i + 1 < raw.size() ? hex(raw[i + 1]) : -1;
      const int lo = i + 2 < raw.size() ? hex(raw[i + 2]) : -1;
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += raw[i];
    }
  }
  return out;
}

std::string top_name(std::string_view decoded_name) {
  return std::string(decoded_name.substr(0, decoded_name.find('[', 1)));
}

std::optional<Value> parse_form(std::string_view body, const FormRules& rules) {
  Normalizer normalizer(rules);
  Value params = container(Value::Kind::object);
  std::size_t count = 0;
  try {
    std::size_t start = 0;
    for (;;) {
      const auto end = body.find('&', start);
      const auto part = body.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
      if (!part.empty()) {
        if (++count > rules.max_params) throw Refused{};
        const auto eq = part.find('=');
        auto name = form_decode(part.substr(0, eq));
        if (!name) throw Refused{};
        Value v;  // null
        if (eq != std::string_view::npos) {
          auto value = form_decode(part.substr(eq + 1));
          if (!value) throw Refused{};
          v = string_value(std::move(*value));
        }
        for (const std::string* s : {&*name, v.kind == Value::Kind::string ? &v.text : &*name}) {
          if (!valid_utf8(*s)) throw Refused{};
          if (rules.ascii_only && std::any_of(s->begin(), s->end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
            throw Refused{};
          }
        }
        if (groups(*name) + 1 > rules.max_depth) throw Refused{};
        params = normalizer.normalize(std::move(params), *name, std::move(v), 0);
      }
      if (end == std::string_view::npos) break;
      start = end + 1;
    }
  } catch (const Refused&) {
    return std::nullopt;
  }
  numbered_to_arrays(params, true);
  return params;
}

}  // namespace idem::fuzz::ref
