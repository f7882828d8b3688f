#pragma once
// A memo of fingerprints by the exact request they were computed from.
//
// A retry usually repeats its request byte for byte, and a fingerprint is a function of
// those bytes and of the route's configuration. Taken from the memo, the fingerprint of
// such a retry costs one SHA-256 over its inputs instead of reading the body (JSON or form
// parse), selecting fields, writing canonical text and hashing that: about a fifth of the
// sidecar's instructions for a replay answered from the replay cache
// (docs/performance.md, "The fingerprint memo").
//
// Why it cannot change an answer:
// - The key is a SHA-256 over everything the body parse and the fingerprint read (method,
//   scope, the configured header values, the query, Content-Type, the body bytes) plus the
//   route and the tenant, each length-prefixed. Equal keys mean equal inputs, hence equal
//   fingerprints; the owner empties the memo when the configuration (fields, defaults,
//   body limits) changes.
// - Only fingerprints of bodies that were read are kept: a body that was refused goes the
//   full way again and is refused again.
// - Keyed by tenant too: another tenant's identical request never makes this one cheaper,
//   so the time of an answer says nothing about other tenants.
//
// Bounded: a fixed number of slots, direct-mapped by the key (a newer entry replaces an
// older one in its slot). Not thread-safe: one per event loop.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "idempotency/fingerprint.hpp"

namespace idem::idempotency {

using MemoKey = std::array<unsigned char, 32>;

// The memo's key for a request on `route` from `tenant`; `parts` as the fingerprint reads
// them, with content_type and body set.
MemoKey memo_key(std::string_view route, std::string_view tenant, const RequestParts& parts);

class FingerprintMemo {
 public:
  static constexpr std::size_t kDefaultSlots = 4096;  // ~400 KiB per event loop
  explicit FingerprintMemo(std::size_t slots = kDefaultSlots);

  // The fingerprint kept for `key`, or nullopt. The view lives until the next insert or
  // clear.
  std::optional<std::string_view> find(const MemoKey& key) const noexcept;
  // Keeps `fingerprint` (64 hex digits; anything else is not kept) for `key`.
  void insert(const MemoKey& key, std::string_view fingerprint) noexcept;
  void clear() noexcept;

 private:
  struct Slot {
    MemoKey key{};
    std::array<char, 64> fingerprint{};
    bool used = false;
  };
  std::size_t index(const MemoKey& key) const noexcept;

  std::unique_ptr<Slot[]> slots_;
  std::size_t count_;
};

}  // namespace idem::idempotency
