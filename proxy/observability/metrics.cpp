// Process-wide metrics in the Prometheus text exposition format 0.0.4.
//
// Every metric is declared once, in IDEM_METRICS below: its member, cell type, exposed name,
// label and help text. Declaration, storage and rendering all expand from that list, so a
// metric cannot be recorded without being exposed, or exposed with a stale name.
//
// Concurrency: a cell is a set of relaxed atomics (metrics need no ordering with anything
// else). A labelled family is a singly linked list that only grows; readers walk it without
// a lock, a writer takes the family's mutex only to publish a new label value. Series are
// never removed, so a pointer handed out stays valid for the life of the Metrics object.
#include "observability/metrics.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace idem::obs {

std::string_view to_string(Outcome o) noexcept {
  switch (o) {
    case Outcome::created: return "created";
    case Outcome::replayed: return "replayed";
    case Outcome::key_reused: return "key_reused";
    case Outcome::in_progress: return "in_progress";
    case Outcome::released: return "released";
    case Outcome::unknown_outcome: return "unknown_outcome";
    case Outcome::rejected: return "rejected";
    case Outcome::store_unavailable: return "store_unavailable";
    case Outcome::passthrough: return "passthrough";
    case Outcome::accepted: return "accepted";
    case Outcome::replay_failed: return "replay_failed";
  }
  return "unknown";
}

std::string_view to_string(StoreOp op) noexcept {
  switch (op) {
    case StoreOp::claim: return "claim";
    case StoreOp::read: return "read";
    case StoreOp::take_over: return "take_over";
    case StoreOp::replace: return "replace";
    case StoreOp::complete: return "complete";
    case StoreOp::release: return "release";
    case StoreOp::renew: return "renew";
    case StoreOp::expire_lease: return "expire_lease";
    case StoreOp::purge: return "purge";
    case StoreOp::cleanup: return "cleanup";
    case StoreOp::register_operation: return "register_operation";
    case StoreOp::find_operation: return "find_operation";
    case StoreOp::note_payload: return "note_payload";
  }
  return "unknown";
}

std::string_view store_error_kind(const error_code& ec) noexcept {
  if (ec == errc::store_timeout) return "timeout";
  if (ec == errc::store_busy) return "busy";
  if (ec == errc::store_unavailable) return "unavailable";
  return "protocol";
}

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

// Request, upstream and store latencies share one scale: sub-millisecond store round trips
// on a local database up to the 30s default upstream timeout.
constexpr std::array<double, 15> kLatencyBuckets{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                 0.025,  0.05,  0.1,    0.25,  0.5,
                                                 1,      2.5,   5,      10,    30};

// Calls per batch statement: powers of two up to the largest database.batch_max (1000).
constexpr std::array<double, 10> kBatchSizeBuckets{2, 4, 8, 16, 32, 64, 128, 256, 512, 1000};

// Labels whose values come from outside a fixed list (route names, error kinds) are capped:
// a bug that feeds request data into a label must not grow memory and scrape size forever.
constexpr std::size_t kMaxSeriesPerFamily = 1000;
constexpr std::string_view kOverflowLabel = "_overflow";

// Store error kinds the pg layer reports; created up front so dashboards see 0, not nothing.
constexpr std::array<std::string_view, 4> kKnownStoreErrors{"unavailable", "timeout", "busy",
                                                            "protocol"};
// What a backend can say of its record, and its directives, likewise exported at 0.
constexpr std::array<std::string_view, 3> kBackendCompletionResults{"confirmed", "differed",
                                                                    "absent"};
constexpr std::array<std::string_view, 3> kDirectives{"release", "record", "invalid"};
// Long operations' lookups at the backend, likewise exported at 0.
constexpr std::array<std::string_view, 3> kRefetchResults{"fetched", "refused", "failed"};
constexpr std::array<std::string_view, 3> kReconcileResults{"found", "not_found", "failed"};
// What a fenced owner can answer (Metrics::fenced_answer), likewise exported at 0.
constexpr std::array<std::string_view, 3> kTraceSpanResults{"exported", "dropped", "failed"};
constexpr std::array<std::string_view, 5> kFencedAnswers{"replayed", "in_progress", "key_reused",
                                                         "forbidden", "unavailable"};

struct Counter {
  std::atomic<std::uint64_t> value{0};
  void add(std::uint64_t n) noexcept { value.fetch_add(n, kRelaxed); }
  std::uint64_t get() const noexcept { return value.load(kRelaxed); }
};

struct Gauge {
  std::atomic<double> value{0};
};

// A histogram over fixed bucket bounds (a reference to a constexpr array).
template <const auto& Bounds>
struct BasicHistogram {
  static constexpr const auto& bounds = Bounds;
  // counts[i] holds observations in (bounds[i-1], bounds[i]]; the last slot is above every
  // bound. Rendering accumulates them, so observing touches exactly one bucket.
  std::array<std::atomic<std::uint64_t>, Bounds.size() + 1> counts{};
  std::atomic<double> sum{0};

  void observe(double v) noexcept {
    // NaN would poison the sum forever; a negative duration is a clock artefact.
    if (std::isnan(v)) return;
    v = std::max(v, 0.0);
    const auto slot = static_cast<std::size_t>(
        std::lower_bound(Bounds.begin(), Bounds.end(), v) - Bounds.begin());
    counts[slot].fetch_add(1, kRelaxed);
    sum.fetch_add(v, kRelaxed);
  }
};
using Histogram = BasicHistogram<kLatencyBuckets>;
using SizeHistogram = BasicHistogram<kBatchSizeBuckets>;

// idemproxy_requests_total is keyed by route; the outcome is an enum, so its nine counters
// sit in one cell and a request costs one route lookup.
struct OutcomeCounters {
  std::array<Counter, kOutcomeCount> by_outcome;
};

template <class Cell>
class Family {
 public:
  struct Series {
    std::string label;
    Cell cell;
    Series* next = nullptr;
  };

  Family(const char* name, const char* label, const char* help)
      : name_(name), label_(label), help_(help) {
    // An unlabelled metric has exactly one series, present from the start.
    if (label_.empty()) get("");
  }
  ~Family() {
    for (Series* s = head_.load(); s != nullptr;) {
      Series* next = s->next;
      delete s;
      s = next;
    }
  }
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  const Cell* find(std::string_view label) const noexcept {
    for (const Series* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      if (s->label == label) return &s->cell;
    }
    return nullptr;
  }

  Cell& get(std::string_view label) {
    if (const Cell* c = find(label)) return const_cast<Cell&>(*c);
    std::lock_guard lock(mutex_);
    // Re-check under the lock: another thread may have published the same label meanwhile.
    if (const Cell* c = find(label)) return const_cast<Cell&>(*c);
    if (size_ >= kMaxSeriesPerFamily && label != kOverflowLabel) {
      if (const Cell* c = find(kOverflowLabel)) return const_cast<Cell&>(*c);
      label = kOverflowLabel;
    }
    auto* s = new Series{std::string(label), {}, head_.load(kRelaxed)};
    ++size_;
    // Release: a reader that sees the node also sees its label and zeroed cell.
    head_.store(s, std::memory_order_release);
    return s->cell;
  }

  // Series in label order, so scrapes are stable and diffable.
  template <class F>
  void for_each_sorted(F&& f) const {
    std::vector<const Series*> all;
    for (const Series* s = head_.load(std::memory_order_acquire); s != nullptr; s = s->next) {
      all.push_back(s);
    }
    std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->label < b->label; });
    for (const Series* s : all) f(s->label, s->cell);
  }

  const std::string& name() const { return name_; }
  const std::string& label() const { return label_; }
  const std::string& help() const { return help_; }

 private:
  std::string name_;
  std::string label_;
  std::string help_;
  std::atomic<Series*> head_{nullptr};
  std::mutex mutex_;
  std::size_t size_ = 0;
};

// clang-format off
#define IDEM_METRICS(X)                                                                          \
  X(requests,           OutcomeCounters, "idemproxy_requests_total",             "route",        \
    "Requests handled, by route and outcome.")                                                   \
  X(request_duration,   Histogram,       "idemproxy_request_duration_seconds",   "route",        \
    "Time from the first byte of a request to the last byte of its response.")                   \
  X(upstream_duration,  Histogram,       "idemproxy_upstream_duration_seconds",  "",             \
    "Duration of upstream exchanges, from connect to the end of the response.")                  \
  X(store_duration,     Histogram,       "idemproxy_store_duration_seconds",     "op",           \
    "Duration of idempotency store operations, by operation.")                                   \
  X(takeovers,          Counter,         "idemproxy_takeovers_total",            "",             \
    "Claims taken over after the previous owner's lease expired.")                               \
  X(fenced_writes,      Counter,         "idemproxy_fenced_writes_total",        "",             \
    "Owner writes (completion, release, renewal, lease expiry) refused: another claim owns the record.")                  \
  X(fenced_answers,     Counter,         "idemproxy_fenced_answers_total",       "answer",       \
    "Answers of owners whose write was fenced, taken from the record instead of their own.")   \
  X(backend_completions, Counter,        "idemproxy_backend_completions_total",  "result",       \
    "Answers of completion: backend routes, by what the backend said it recorded.")           \
  X(directives,         Counter,         "idemproxy_backend_directives_total",   "directive",    \
    "Backend directives that released or recorded one answer against the route's store lists.") \
  X(refetches,          Counter,         "idemproxy_refetches_total",            "result",       \
    "Replays that re-fetched their resource (replay.mode: refetch), by result.")                 \
  X(same_payload,       Counter,         "idemproxy_same_payload_new_key_total", "route",        \
    "New keys whose request carried the payload of a recent request of another key (same_payload_new_key).") \
  X(reconciliations,    Counter,         "idemproxy_reconciliations_total",      "result",       \
    "Takeovers that asked the backend whether the operation happened, by its answer.")          \
  X(async_operations,   Counter,         "idemproxy_async_operations_total",     "outcome",      \
    "Long operations (routes with async) that finished after their client got 202, by outcome.") \
  X(lease_renewals,     Counter,         "idemproxy_lease_renewals_total",       "",             \
    "Lease renewals by owners waiting on the upstream.")                                         \
  X(expired_deleted,    Counter,         "idemproxy_expired_deleted_total",      "",             \
    "Expired records deleted by the retention task.")                                            \
  X(store_batches,      Counter,         "idemproxy_store_batches_total",        "op",           \
    "Statements that carried the calls of several requests at once (database.batching), by operation.") \
  X(store_batched_calls, Counter,        "idemproxy_store_batched_calls_total",  "op",           \
    "Calls those statements carried; divided by idemproxy_store_batches_total, the mean batch size.") \
  X(store_batch_size,   SizeHistogram,   "idemproxy_store_batch_size",           "op",           \
    "Calls per batch statement (database.batching), by operation: the distribution of batch sizes.") \
  X(store_errors,       Counter,         "idemproxy_store_errors_total",         "kind",         \
    "Failed store operations, by kind of failure.")                                              \
  X(in_progress_oldest, Gauge,           "idemproxy_in_progress_oldest_seconds", "",             \
    "Age of the oldest claim this process holds (0 when none): a stuck claim shows here.")     \
  X(cache_lookups,      Counter,         "idemproxy_replay_cache_lookups_total", "result",       \
    "Replay cache lookups of protected requests while the cache is active, by result.")          \
  X(memo_lookups,       Counter,         "idemproxy_fingerprint_memo_lookups_total", "result",   \
    "Protected requests whose fingerprint was looked up in the fingerprint memo, by result (hit: the same bytes were fingerprinted before).") \
  X(cache_notifications, Counter,        "idemproxy_replay_cache_notifications_total", "",      \
    "Record changes announced by PostgreSQL and evicted from the replay cache.")                 \
  X(cache_active,       Gauge,           "idemproxy_replay_cache_active",        "",             \
    "1 while the replay cache serves (enabled and listening for record changes), else 0.")      \
  X(cache_entries,      Gauge,           "idemproxy_replay_cache_entries",       "",             \
    "Records held by the replay cache.")                                                         \
  X(cache_bytes,        Gauge,           "idemproxy_replay_cache_bytes",         "",             \
    "Approximate memory held by the replay cache.")                                              \
  X(trace_spans,        Counter,         "idemproxy_trace_spans_total",          "result",       \
    "Spans of the OTLP exporter: exported, dropped (queue full) or failed (every attempt to export failed).") \
  X(trace_retries,      Counter,         "idemproxy_trace_export_retries_total", "",             \
    "Exports of a batch of spans tried again after a failed attempt.")                          \
  X(schema_version,     Gauge,           "idemproxy_schema_version",             "of",           \
    "Schema versions seen by the readiness probe: of=\"binary\" (the newest this binary embeds), of=\"database\" (the newest applied).") \
  X(schema_newer,       Gauge,           "idemproxy_schema_newer_compatible",    "",             \
    "1 while this replica serves a database migrated by a newer, compatible release, else 0.")
// clang-format on

// --- Prometheus text format -------------------------------------------------------------

// Shortest text that reads back as the same double. Sample values may use exponents; bucket
// bounds are written in fixed notation because `le` is matched as a string by queries and
// every client library spells 0.0005 that way, never "5e-04".
void append_double(std::string& out, double v, bool fixed = false) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    std::array<char, 64> buf{};
    const auto [end, ec] = fixed ? std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::fixed)
                                 : std::to_chars(buf.data(), buf.data() + buf.size(), v);
    out.append(buf.data(), ec == std::errc{} ? end : buf.data());
  }
}

void append_label_value(std::string& out, std::string_view v) {
  out += '"';
  for (char c : v) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  out += '"';
}

void append_help(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// One sample line: name{labels} value. `extra` is an already formatted label pair (le=...,
// outcome=...) that follows the family's own label.
void append_sample_start(std::string& out, std::string_view name, std::string_view suffix,
                         const std::string& label, std::string_view value,
                         std::string_view extra_name = {}, std::string_view extra_value = {}) {
  out += name;
  out += suffix;
  const bool has_label = !label.empty();
  const bool has_extra = !extra_name.empty();
  if (has_label || has_extra) {
    out += '{';
    if (has_label) {
      out += label;
      out += '=';
      append_label_value(out, value);
    }
    if (has_extra) {
      if (has_label) out += ',';
      out += extra_name;
      out += '=';
      append_label_value(out, extra_value);
    }
    out += '}';
  }
  out += ' ';
}

constexpr const char* type_of(const Counter*) { return "counter"; }
constexpr const char* type_of(const OutcomeCounters*) { return "counter"; }
constexpr const char* type_of(const Gauge*) { return "gauge"; }
template <const auto& B>
constexpr const char* type_of(const BasicHistogram<B>*) { return "histogram"; }

template <class Cell>
void render_cell(std::string& out, const Family<Cell>& f, const std::string& value, const Counter& c) {
  append_sample_start(out, f.name(), "", f.label(), value);
  out += std::to_string(c.get());
  out += '\n';
}

template <class Cell>
void render_cell(std::string& out, const Family<Cell>& f, const std::string& value, const Gauge& g) {
  append_sample_start(out, f.name(), "", f.label(), value);
  append_double(out, g.value.load(kRelaxed));
  out += '\n';
}

template <class Cell>
void render_cell(std::string& out, const Family<Cell>& f, const std::string& value,
                 const OutcomeCounters& c) {
  for (int i = 0; i < kOutcomeCount; ++i) {
    append_sample_start(out, f.name(), "", f.label(), value, "outcome",
                        to_string(static_cast<Outcome>(i)));
    out += std::to_string(c.by_outcome[static_cast<std::size_t>(i)].get());
    out += '\n';
  }
}

template <class Cell, const auto& B>
void render_cell(std::string& out, const Family<Cell>& f, const std::string& value,
                 const BasicHistogram<B>& h) {
  // Buckets are read once and accumulated here; _count is the +Inf bucket by construction,
  // so a scrape racing with observations is still self-consistent (sum may lag by a sample).
  std::uint64_t cumulative = 0;
  std::string le;
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i].load(kRelaxed);
    le.clear();
    if (i < B.size()) {
      append_double(le, B[i], true);
    } else {
      le = "+Inf";
    }
    append_sample_start(out, f.name(), "_bucket", f.label(), value, "le", le);
    out += std::to_string(cumulative);
    out += '\n';
  }
  append_sample_start(out, f.name(), "_sum", f.label(), value);
  append_double(out, h.sum.load(kRelaxed));
  out += '\n';
  append_sample_start(out, f.name(), "_count", f.label(), value);
  out += std::to_string(cumulative);
  out += '\n';
}

template <class Cell>
void render_family(std::string& out, const Family<Cell>& f) {
  out += "# HELP ";
  out += f.name();
  out += ' ';
  append_help(out, f.help());
  out += "\n# TYPE ";
  out += f.name();
  out += ' ';
  out += type_of(static_cast<const Cell*>(nullptr));
  out += '\n';
  f.for_each_sorted([&](const std::string& label, const Cell& cell) { render_cell(out, f, label, cell); });
}

}  // namespace

struct Metrics::Impl {
#define IDEM_DECLARE_FAMILY(member, Cell, name, label, help) Family<Cell> member{name, label, help};
  IDEM_METRICS(IDEM_DECLARE_FAMILY)
#undef IDEM_DECLARE_FAMILY

  // Cells whose label values are known up front, resolved once so their hot path is a
  // single atomic add.
  Histogram& upstream = upstream_duration.get("");
  Counter& takeover = takeovers.get("");
  Counter& fenced = fenced_writes.get("");
  Counter& renewal = lease_renewals.get("");
  Counter& expired = expired_deleted.get("");
  Gauge& oldest = in_progress_oldest.get("");
  Counter& cache_hit = cache_lookups.get("hit");
  Counter& cache_miss = cache_lookups.get("miss");
  Counter& memo_hit = memo_lookups.get("hit");
  Counter& memo_miss = memo_lookups.get("miss");
  Counter& cache_notified = cache_notifications.get("");
  Gauge& cache_on = cache_active.get("");
  Gauge& cache_count = cache_entries.get("");
  Gauge& cache_size = cache_bytes.get("");
  Counter& trace_retry = trace_retries.get("");
  Gauge& schema_binary = schema_version.get("binary");
  Gauge& schema_database = schema_version.get("database");
  Gauge& schema_newer_compatible = schema_newer.get("");
  std::array<Histogram*, kStoreOpCount> store_ops{};

  Impl() {
    for (int i = 0; i < kStoreOpCount; ++i) {
      store_ops[static_cast<std::size_t>(i)] = &store_duration.get(to_string(static_cast<StoreOp>(i)));
    }
    for (auto kind : kKnownStoreErrors) store_errors.get(kind);
    for (auto op : {"claim", "complete", "release", "renew"}) {
      store_batches.get(op);
      store_batched_calls.get(op);
      store_batch_size.get(op);
    }
    for (auto answer : kFencedAnswers) fenced_answers.get(answer);
    for (auto result : kBackendCompletionResults) backend_completions.get(result);
    for (auto d : kDirectives) directives.get(d);
    for (auto r : kRefetchResults) refetches.get(r);
    for (auto r : kReconcileResults) reconciliations.get(r);
    for (auto r : kTraceSpanResults) trace_spans.get(r);
    // Requests the listener refuses itself count under "unmatched" before any route exists.
    requests.get("unmatched");
    request_duration.get("unmatched");
  }
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::declare_routes(const std::vector<std::string>& routes) {
  impl_->requests.get("unmatched");
  impl_->request_duration.get("unmatched");
  for (const auto& r : routes) {
    impl_->requests.get(r);
    impl_->request_duration.get(r);
  }
}

void Metrics::request(std::string_view route, Outcome outcome, double seconds) {
  const auto i = static_cast<std::size_t>(outcome);
  if (i < static_cast<std::size_t>(kOutcomeCount)) impl_->requests.get(route).by_outcome[i].add(1);
  impl_->request_duration.get(route).observe(seconds);
}

void Metrics::upstream_duration(double seconds) { impl_->upstream.observe(seconds); }

void Metrics::store_duration(StoreOp op, double seconds) {
  const auto i = static_cast<std::size_t>(op);
  if (i < impl_->store_ops.size()) impl_->store_ops[i]->observe(seconds);
}

void Metrics::store_batch(std::string_view op, std::uint64_t calls) {
  impl_->store_batches.get(op).add(1);
  impl_->store_batched_calls.get(op).add(calls);
  impl_->store_batch_size.get(op).observe(static_cast<double>(calls));
}

void Metrics::takeover() { impl_->takeover.add(1); }
void Metrics::fenced_write() { impl_->fenced.add(1); }
void Metrics::fenced_answer(std::string_view answer) { impl_->fenced_answers.get(answer).add(1); }
void Metrics::backend_completion(std::string_view result) {
  impl_->backend_completions.get(result).add(1);
}
void Metrics::directive(std::string_view directive) { impl_->directives.get(directive).add(1); }
void Metrics::refetch(std::string_view result) { impl_->refetches.get(result).add(1); }
void Metrics::same_payload_new_key(std::string_view route) { impl_->same_payload.get(route).add(1); }
void Metrics::reconciliation(std::string_view result) {
  impl_->reconciliations.get(result).add(1);
}
void Metrics::async_operation(Outcome outcome) {
  impl_->async_operations.get(to_string(outcome)).add(1);
}
void Metrics::lease_renewal() { impl_->renewal.add(1); }
void Metrics::expired_deleted(std::uint64_t n) { impl_->expired.add(n); }
void Metrics::store_error(std::string_view kind) { impl_->store_errors.get(kind).add(1); }
void Metrics::set_in_progress_oldest(double seconds) { impl_->oldest.value.store(seconds, kRelaxed); }
void Metrics::set_schema(int binary_version, int database_version, bool newer_compatible) {
  impl_->schema_binary.value.store(binary_version, kRelaxed);
  impl_->schema_database.value.store(database_version, kRelaxed);
  impl_->schema_newer_compatible.value.store(newer_compatible ? 1.0 : 0.0, kRelaxed);
}
void Metrics::replay_cache_lookup(bool hit) { (hit ? impl_->cache_hit : impl_->cache_miss).add(1); }
void Metrics::fingerprint_memo_lookup(bool hit) { (hit ? impl_->memo_hit : impl_->memo_miss).add(1); }
void Metrics::trace_spans(std::string_view result, std::uint64_t n) {
  impl_->trace_spans.get(result).add(n);
}
void Metrics::trace_export_retry() { impl_->trace_retry.add(1); }
std::uint64_t Metrics::trace_export_retries() const { return impl_->trace_retry.get(); }
std::uint64_t Metrics::trace_spans(std::string_view result) const {
  const auto* c = impl_->trace_spans.find(result);
  return c != nullptr ? c->get() : 0;
}
void Metrics::replay_cache_notification() { impl_->cache_notified.add(1); }
void Metrics::set_replay_cache(bool active, std::size_t entries, std::size_t bytes) {
  impl_->cache_on.value.store(active ? 1.0 : 0.0, kRelaxed);
  impl_->cache_count.value.store(static_cast<double>(entries), kRelaxed);
  impl_->cache_size.value.store(static_cast<double>(bytes), kRelaxed);
}

std::uint64_t Metrics::requests(std::string_view route, Outcome outcome) const {
  const auto i = static_cast<std::size_t>(outcome);
  const auto* c = impl_->requests.find(route);
  return c != nullptr && i < static_cast<std::size_t>(kOutcomeCount) ? c->by_outcome[i].get() : 0;
}

std::uint64_t Metrics::takeovers() const { return impl_->takeover.get(); }
std::uint64_t Metrics::fenced_writes() const { return impl_->fenced.get(); }
std::uint64_t Metrics::fenced_answers(std::string_view answer) const {
  const auto* c = impl_->fenced_answers.find(answer);
  return c != nullptr ? c->get() : 0;
}
std::uint64_t Metrics::backend_completions(std::string_view result) const {
  const auto* c = impl_->backend_completions.find(result);
  return c != nullptr ? c->get() : 0;
}
std::uint64_t Metrics::directives(std::string_view directive) const {
  const auto* c = impl_->directives.find(directive);
  return c != nullptr ? c->get() : 0;
}
std::uint64_t Metrics::async_operations(Outcome outcome) const {
  const auto* c = impl_->async_operations.find(to_string(outcome));
  return c != nullptr ? c->get() : 0;
}

std::uint64_t Metrics::same_payload_new_keys(std::string_view route) const {
  const auto* c = impl_->same_payload.find(route);
  return c != nullptr ? c->get() : 0;
}

std::uint64_t Metrics::refetches(std::string_view result) const {
  const auto* c = impl_->refetches.find(result);
  return c != nullptr ? c->get() : 0;
}
std::uint64_t Metrics::reconciliations(std::string_view result) const {
  const auto* c = impl_->reconciliations.find(result);
  return c != nullptr ? c->get() : 0;
}
std::uint64_t Metrics::replay_cache_hits() const { return impl_->cache_hit.get(); }
std::uint64_t Metrics::fingerprint_memo_lookups(bool hit) const {
  return (hit ? impl_->memo_hit : impl_->memo_miss).get();
}
std::uint64_t Metrics::replay_cache_notifications() const { return impl_->cache_notified.get(); }

std::string Metrics::render_prometheus() const {
  std::string out;
  out.reserve(16 * 1024);
#define IDEM_RENDER_FAMILY(member, Cell, name, label, help) render_family(out, impl_->member);
  IDEM_METRICS(IDEM_RENDER_FAMILY)
#undef IDEM_RENDER_FAMILY
  return out;
}

}  // namespace idem::obs
