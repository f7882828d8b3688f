// JSON Pointers (RFC 6901), shared by the fingerprint's fields, ignore and defaults and by the
// key reader's key.pointer.
#include "idempotency/internal.hpp"

namespace idem::idempotency::detail {

namespace {

// RFC 6901 array index: "0" or digits without a leading zero. "-" (one past the end)
// names no existing element, so it never matches anything.
std::optional<std::size_t> array_index(std::string_view seg) noexcept {
  if (seg.empty() || (seg.size() > 1 && seg.front() == '0')) return std::nullopt;
  std::size_t v = 0;
  for (const char c : seg) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::size_t>(c - '0');
    if (v > (static_cast<std::size_t>(-1) - d) / 10) return std::nullopt;  // no array is that long
    v = v * 10 + d;
  }
  return v;
}

}  // namespace

std::optional<std::vector<std::string>> parse_pointer(std::string_view text, std::string* why) {
  std::vector<std::string> segments;
  if (text.empty()) return segments;  // the whole document
  if (text.front() != '/') {
    *why = "a JSON Pointer must be empty or start with '/'";
    return std::nullopt;
  }
  std::string seg;
  for (std::size_t i = 1; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '/') {
      segments.push_back(std::move(seg));
      seg.clear();
      continue;
    }
    if (text[i] == '~') {
      if (i + 1 < text.size() && (text[i + 1] == '0' || text[i + 1] == '1')) {
        seg.push_back(text[i + 1] == '0' ? '~' : '/');
        ++i;
        continue;
      }
      *why = "'~' must be followed by 0 or 1";
      return std::nullopt;
    }
    seg.push_back(text[i]);
  }
  return segments;
}

const Json* child_of(const Json& node, const std::string& seg) {
  if (const auto* o = node.as_object()) {
    const auto it = o->find(seg);
    return it == o->end() ? nullptr : &it->second;
  }
  if (const auto* a = node.as_array()) {
    const auto idx = array_index(seg);
    return (idx && *idx < a->size()) ? &(*a)[*idx] : nullptr;
  }
  return nullptr;
}

const Json* find_pointer(const Json& root, const std::vector<std::string>& segments) {
  const Json* at = &root;
  for (const auto& seg : segments) {
    at = child_of(*at, seg);
    if (at == nullptr) return nullptr;
  }
  return at;
}

}  // namespace idem::idempotency::detail
