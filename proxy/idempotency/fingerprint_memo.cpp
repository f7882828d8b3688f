#include "idempotency/fingerprint_memo.hpp"

#include "idempotency/internal.hpp"

#include <cstring>
#include <string>

namespace idem::idempotency {
namespace {

constexpr std::string_view kMemoDomain = "idemproxy-fingerprint-memo/1";

using detail::put_item;

// Absent and empty are different inputs to the fingerprint, so they are here too.
void put_optional(std::string& out, const std::optional<std::string_view>& item) {
  if (!item) {
    out.push_back('-');
    return;
  }
  out.push_back('+');
  put_item(out, *item);
}

}  // namespace

MemoKey memo_key(std::string_view route, std::string_view tenant, const RequestParts& parts) {
  std::string in;
  in.reserve(kMemoDomain.size() + route.size() + tenant.size() + parts.method.size() +
             parts.scope.size() + parts.query.size() + parts.body.size() + 160);
  put_item(in, kMemoDomain);
  put_item(in, route);
  put_item(in, tenant);
  put_item(in, parts.method);
  put_item(in, parts.scope);
  put_optional(in, parts.content_type);
  put_item(in, std::to_string(parts.header_values.size()));
  for (const auto& value : parts.header_values) {
    put_optional(in, value ? std::optional<std::string_view>(*value) : std::nullopt);
  }
  put_item(in, parts.query);
  put_item(in, parts.body);
  MemoKey key;
  sha256(in, key.data());
  return key;
}

FingerprintMemo::FingerprintMemo(std::size_t slots)
    : slots_(std::make_unique<Slot[]>(slots == 0 ? 1 : slots)), count_(slots == 0 ? 1 : slots) {}

std::size_t FingerprintMemo::index(const MemoKey& key) const noexcept {
  // The key is a uniform hash already: its first bytes pick the slot.
  std::uint64_t v = 0;
  std::memcpy(&v, key.data(), sizeof v);
  return static_cast<std::size_t>(v % count_);
}

std::optional<std::string_view> FingerprintMemo::find(const MemoKey& key) const noexcept {
  const Slot& s = slots_[index(key)];
  if (!s.used || s.key != key) return std::nullopt;
  return std::string_view(s.fingerprint.data(), s.fingerprint.size());
}

void FingerprintMemo::insert(const MemoKey& key, std::string_view fingerprint) noexcept {
  Slot& s = slots_[index(key)];
  if (fingerprint.size() != s.fingerprint.size()) return;
  s.key = key;
  std::memcpy(s.fingerprint.data(), fingerprint.data(), fingerprint.size());
  s.used = true;
}

void FingerprintMemo::clear() noexcept {
  for (std::size_t i = 0; i < count_; ++i) slots_[i].used = false;
}

}  // namespace idem::idempotency
