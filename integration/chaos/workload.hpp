#pragma once
// What the clients of the fault-injection run do, decided from the seed alone: the plan of
// client operations, and the equivalent forms of every request body. Pure (no I/O), so a
// seed always means the same workload and the rules are unit-tested.
//
// Vocabulary:
//   operation  one (tenant, key) and the order it stands for: at most one order may
//              ever exist for it. The same raw key is used by several tenants at once,
//              with the same body, so that only tenant scoping keeps them apart.
//   entry      one client operation on an operation: a request retried with the same key
//              until its answer is definite. An operation has a first entry, and may have
//              concurrent duplicates, an entry that reuses the key with another body
//              (at once, racing, or later) and a replay placed later in the plan.
//   form       the rendering of a body for one attempt: member order, 1000 vs 1000.0 vs
//              1000E0, the default currency omitted, fields outside the fingerprint,
//              whitespace, the key bare or as an RFC 8941 string. Every form of a body has
//              the same fingerprint under the route of the run (chaos_route()).
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::chaos {

// SplitMix64: tiny, fast, and the same sequence on every platform and standard library
// (std::uniform_int_distribution is not), which is what "the same seed, the same run"
// needs.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, n); n > 0.
  std::uint64_t below(std::uint64_t n);
  // Uniform in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi);
  bool chance(double p);
  // A seed for an independent stream, e.g. per entry: derive(seed, index).
  static std::uint64_t derive(std::uint64_t seed, std::uint64_t stream);

 private:
  std::uint64_t state_;
};

struct Item {
  std::string sku;
  std::int64_t qty = 1;
};

// The fields that make an order what it is (the route fingerprints exactly these).
struct OrderBody {
  std::string customer_id;
  std::string currency = "EUR";  // the route's and the API's default
  std::int64_t amount = 0;
  std::vector<Item> items;
  std::optional<std::string> checkout_id;
};

struct Operation {
  std::size_t id = 0;
  std::string tenant;
  std::string key;
  // [0] the body every entry uses, [1] another body under the same key (reuse entries).
  std::array<OrderBody, 2> bodies;
};

enum class EntryKind { first, duplicate, reuse, replay };
std::string_view entry_kind_name(EntryKind kind);

struct Entry {
  std::size_t operation = 0;
  EntryKind kind = EntryKind::first;
  int body = 0;  // index into Operation::bodies
};

struct PlanOptions {
  std::size_t entries = 1000;
  std::size_t tenants = 3;         // 1..26
  double duplicate = 0.4;          // chance of 1-3 concurrent duplicates
  double reuse = 0.1;              // chance of an entry with the other body
  double reuse_concurrent = 0.5;   // ... sent with the first entry rather than later
  double replay = 0.3;             // chance of a replay later in the plan
  std::size_t replay_distance = 400;  // how much later, at most, in entries
};

struct Plan {
  std::vector<std::string> tenants;
  std::vector<Operation> operations;
  std::vector<Entry> entries;  // in the order clients take them
};

Plan make_plan(std::uint64_t seed, const PlanOptions& options);

// One equivalent form of a body, chosen by the bits of `form` (any 32-bit value).
std::string render_body(const OrderBody& body, std::uint32_t form);
// The key as sent: bare, or as an RFC 8941 string when `form` says so.
std::string render_key(std::string_view key, std::uint32_t form);

}  // namespace idem::chaos
