#include "workload.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace idem::chaos {

// ----------------------------------------------------------------------------- Rng

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t Rng::below(std::uint64_t n) {
  // Rejection sampling: no modulo bias, however large n is.
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
  for (;;) {
    const std::uint64_t v = next();
    if (v < limit) return v % n;
  }
}

std::int64_t Rng::between(std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
}

bool Rng::chance(double p) {
  return static_cast<double>(next() >> 11) * 0x1.0p-53 < p;
}

std::uint64_t Rng::derive(std::uint64_t seed, std::uint64_t stream) {
  Rng r(seed ^ (stream * 0xd1b54a32d192ed03ULL));
  r.next();
  return r.next();
}

std::string_view entry_kind_name(EntryKind kind) {
  switch (kind) {
    case EntryKind::first: return "first";
    case EntryKind::duplicate: return "duplicate";
    case EntryKind::reuse: return "reuse";
    case EntryKind::replay: return "replay";
  }
  return "?";
}

// ---------------------------------------------------------------------------- plan

namespace {

OrderBody random_body(Rng& rng, std::size_t family) {
  OrderBody b;
  b.customer_id = "cust-" + std::to_string(family);
  b.currency = rng.chance(0.8) ? "EUR" : "USD";
  b.amount = rng.between(100, 99'999);
  const auto items = rng.between(1, 3);
  for (std::int64_t i = 0; i < items; ++i) {
    b.items.push_back({"SKU-" + std::to_string(rng.between(1, 40)), rng.between(1, 5)});
  }
  if (rng.chance(0.5)) b.checkout_id = "co-" + std::to_string(family);
  return b;
}

}  // namespace

// Families of operations are laid out on a line of positions: everything of a family
// starts at its position (the operations of its tenants, their duplicates, a racing
// reuse), and its later entries land further on. Sorting by position gives the order in
// which clients take entries, so entries at one position run concurrently.
Plan make_plan(std::uint64_t seed, const PlanOptions& options) {
  Plan plan;
  const std::size_t tenants = std::clamp<std::size_t>(options.tenants, 1, 26);
  for (std::size_t t = 0; t < tenants; ++t) {
    plan.tenants.push_back(std::string("tenant-") + static_cast<char>('a' + t));
  }
  Rng rng(seed);
  // (position, sequence, entry): the sequence keeps the sort stable and deterministic.
  std::vector<std::tuple<std::size_t, std::size_t, Entry>> laid;
  std::size_t position = 0;
  for (std::size_t family = 0; laid.size() < options.entries; ++family, ++position) {
    // The same raw key and the same body for 1 to 3 tenants at once.
    const std::size_t wanted = std::min<std::size_t>(tenants, rng.chance(0.5)   ? 1
                                                             : rng.chance(0.6) ? 2
                                                                               : 3);
    std::vector<std::string> chosen = plan.tenants;
    for (std::size_t i = 0; i + 1 < chosen.size(); ++i) {  // partial Fisher-Yates
      std::swap(chosen[i], chosen[i + rng.below(chosen.size() - i)]);
    }
    chosen.resize(wanted);
    const OrderBody body = random_body(rng, family);
    OrderBody other = body;
    other.amount += rng.between(1, 50);
    for (const auto& tenant : chosen) {
      Operation op{.id = plan.operations.size(),
                   .tenant = tenant,
                   .key = "key-" + std::to_string(family),
                   .bodies = {body, other}};
      const auto add = [&](std::size_t at, EntryKind kind, int which) {
        laid.emplace_back(at, laid.size(), Entry{op.id, kind, which});
      };
      add(position, EntryKind::first, 0);
      if (rng.chance(options.duplicate)) {
        const auto copies = rng.between(1, 3);
        for (std::int64_t i = 0; i < copies; ++i) add(position, EntryKind::duplicate, 0);
      }
      if (rng.chance(options.reuse)) {
        const bool racing = rng.chance(options.reuse_concurrent);
        add(racing ? position : position + 1 + rng.below(options.replay_distance),
            EntryKind::reuse, 1);
      }
      if (rng.chance(options.replay)) {
        add(position + 1 + rng.below(options.replay_distance), EntryKind::replay, 0);
      }
      plan.operations.push_back(std::move(op));
    }
  }
  std::sort(laid.begin(), laid.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  });
  // Later families' delayed entries may fall beyond the end: the plan is a prefix.
  for (std::size_t i = 0; i < options.entries && i < laid.size(); ++i) {
    plan.entries.push_back(std::get<2>(laid[i]));
  }
  return plan;
}

// --------------------------------------------------------------------------- forms

namespace {

// Bits of a form.
constexpr std::uint32_t kOrderMask = 0x3;       // member order: as is, reversed, rotated
constexpr std::uint32_t kAmountShift = 2;       // 2 bits: 1000, 1000.0, 1000E0
constexpr std::uint32_t kOmitCurrency = 1u << 4;
constexpr std::uint32_t kNote = 1u << 5;        // "note": outside the fingerprint
constexpr std::uint32_t kSentAt = 1u << 6;      // "client_sent_at": outside the fingerprint
constexpr std::uint32_t kQtyFirst = 1u << 7;    // {"qty":..,"sku":..}
constexpr std::uint32_t kQtyDouble = 1u << 8;   // "qty": 2.0
constexpr std::uint32_t kSpaced = 1u << 9;      // whitespace everywhere it is allowed
constexpr std::uint32_t kNullCheckout = 1u << 10;  // "checkout_id": null when there is none
constexpr std::uint32_t kQuotedKey = 1u << 11;

std::string number(std::int64_t n, std::uint32_t how) {
  switch (how) {
    case 1: return std::to_string(n) + ".0";
    case 2: return std::to_string(n) + "E0";
    default: return std::to_string(n);
  }
}

std::string quoted(std::string_view s) {
  // Our values are plain ASCII without quotes or backslashes (ids, SKUs, currencies).
  return "\"" + std::string(s) + "\"";
}

}  // namespace

std::string render_body(const OrderBody& body, std::uint32_t form) {
  const bool spaced = form & kSpaced;
  const std::string colon = spaced ? " : " : ":";
  const std::string comma = spaced ? ",\n  " : ",";
  const auto member = [&](std::string_view name, const std::string& value) {
    return quoted(name) + colon + value;
  };

  std::string items = "[";
  for (std::size_t i = 0; i < body.items.size(); ++i) {
    const auto& item = body.items[i];
    const std::string sku = member("sku", quoted(item.sku));
    const std::string qty = member("qty", (form & kQtyDouble) ? std::to_string(item.qty) + ".0"
                                                              : std::to_string(item.qty));
    if (i > 0) items += comma;
    items += "{" + ((form & kQtyFirst) ? qty + comma + sku : sku + comma + qty) + "}";
  }
  items += "]";

  std::vector<std::string> members;
  members.push_back(member("customer_id", quoted(body.customer_id)));
  if (!(body.currency == "EUR" && (form & kOmitCurrency))) {
    members.push_back(member("currency", quoted(body.currency)));
  }
  members.push_back(member("amount", number(body.amount, (form >> kAmountShift) & 0x3)));
  members.push_back(member("items", items));
  if (body.checkout_id) {
    members.push_back(member("checkout_id", quoted(*body.checkout_id)));
  } else if (form & kNullCheckout) {
    members.push_back(member("checkout_id", "null"));
  }
  if (form & kNote) members.push_back(member("note", quoted("form " + std::to_string(form))));
  if (form & kSentAt) {
    members.push_back(member("client_sent_at", quoted("2024-01-01T00:00:" +
                                                       std::to_string(10 + form % 50) + "Z")));
  }
  switch (form & kOrderMask) {
    case 1: std::reverse(members.begin(), members.end()); break;
    case 2: std::rotate(members.begin(), members.begin() + 1, members.end()); break;
    default: break;
  }
  std::string out = spaced ? "{\n  " : "{";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += comma;
    out += members[i];
  }
  return out + (spaced ? "\n}" : "}");
}

std::string render_key(std::string_view key, std::uint32_t form) {
  return (form & kQuotedKey) ? quoted(key) : std::string(key);
}

}  // namespace idem::chaos
