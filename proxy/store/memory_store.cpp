#include "store/memory_store.hpp"

#include <algorithm>

namespace idem::store {

// Mirrors one idempotency_requests row; optional fields are the nullable columns.
struct MemoryStore::Row {
  std::string fingerprint;
  std::string principal;
  State state = State::in_progress;
  std::int64_t attempt = 0;
  std::int64_t fence = 0;
  std::optional<Clock::time_point> lease_expires_at;
  std::optional<StoredResponse> response;
  Clock::time_point created_at;
  std::optional<Clock::time_point> completed_at;
  Clock::time_point expires_at;
  // The counterpart of an idempotency_operations entry: it goes with the row (a new claim
  // of the key creates a new Row, unregistered, as PostgreSQL's cascade leaves it).
  bool operation_registered = false;
};

namespace {

using Clock = MemoryStore::Clock;

std::int64_t epoch_us(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// Built in place: result<bool> refuses an implicit error_code (itself convertible to bool).
template <class T>
result<T> unavailable() {
  return result<T>(boost::system::in_place_error, make_error_code(errc::store_unavailable));
}

}  // namespace

MemoryStore::MemoryStore(Now now) : now_(std::move(now)) {}

void MemoryStore::set_unavailable(bool unavailable) {
  std::lock_guard lock(mutex_);
  unavailable_ = unavailable;
}

std::size_t MemoryStore::size() const {
  std::lock_guard lock(mutex_);
  return rows_.size();
}

// Each operation takes the mutex once and does its whole check-and-write under it: the
// in-memory counterpart of PostgreSQL's single-statement atomicity. No lock is ever held
// across a suspension point (the bodies never co_await).

asio::awaitable<result<ClaimResult>> MemoryStore::claim(const ClaimRequest& req) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<ClaimResult>();
  Key key{req.id.tenant, req.id.endpoint, req.id.key};
  // Drawn before the conflict check, as the INSERT's nextval() is: a lost claim uses one up.
  const std::int64_t fence = ++last_fence_;
  if (rows_.count(key) != 0) co_return ClaimResult{};
  const auto now = now_();
  auto row = std::make_shared<Row>();
  row->fingerprint = req.fingerprint;
  row->principal = req.principal;
  row->state = State::in_progress;
  row->attempt = 1;
  row->fence = fence;
  row->lease_expires_at = now + req.lease;
  row->created_at = now;
  row->expires_at = now + std::max(req.retention, req.lease);
  const Ownership owner{1, fence, epoch_us(row->created_at), epoch_us(row->expires_at)};
  rows_.emplace(std::move(key), std::move(row));
  co_return ClaimResult{true, owner};
}

// The record a read sees, as of `now`.
Record MemoryStore::record_of(const Row& row, Clock::time_point now) {
  Record rec;
  rec.fingerprint = row.fingerprint;
  rec.principal = row.principal;
  rec.state = row.state;
  rec.attempt = row.attempt;
  rec.fence = row.fence;
  const bool in_progress = row.state == State::in_progress;
  rec.lease_expired = in_progress && row.lease_expires_at && *row.lease_expires_at <= now;
  rec.expired = row.expires_at <= now;
  if (in_progress && row.lease_expires_at && *row.lease_expires_at > now) {
    // Rounded up like the SQL's ceil(): a live lease never reads as 0 ms remaining.
    rec.lease_remaining = std::chrono::ceil<Millis>(*row.lease_expires_at - now);
  }
  // Rounded down like the SQL's floor(): never claims more time than is left.
  if (row.expires_at > now) rec.retention_remaining = std::chrono::floor<Millis>(row.expires_at - now);
  if (row.state == State::completed) rec.response = row.response;
  rec.created_at_us = epoch_us(row.created_at);
  rec.completed_at_us = row.completed_at ? epoch_us(*row.completed_at) : 0;
  rec.expires_at_us = epoch_us(row.expires_at);
  rec.lease_expires_at_us = row.lease_expires_at ? epoch_us(*row.lease_expires_at) : 0;
  return rec;
}

asio::awaitable<result<std::optional<Record>>> MemoryStore::read(const RecordId& id) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::optional<Record>>();
  auto it = rows_.find(Key{id.tenant, id.endpoint, id.key});
  if (it == rows_.end()) co_return std::optional<Record>{};
  co_return std::optional<Record>{record_of(*it->second, now_())};
}

asio::awaitable<result<std::optional<Ownership>>> MemoryStore::take_over(
    const RecordId& id, std::int64_t seen_fence, Millis lease) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::optional<Ownership>>();
  auto it = rows_.find(Key{id.tenant, id.endpoint, id.key});
  if (it == rows_.end()) co_return std::optional<Ownership>{};
  Row& row = *it->second;
  const auto now = now_();
  if (row.state != State::in_progress || row.fence != seen_fence || !row.lease_expires_at ||
      *row.lease_expires_at > now) {
    co_return std::optional<Ownership>{};
  }
  row.attempt += 1;
  row.fence = ++last_fence_;
  row.lease_expires_at = now + lease;
  row.expires_at = std::max(row.expires_at, now + lease);
  co_return std::optional<Ownership>{
      Ownership{row.attempt, row.fence, epoch_us(row.created_at), epoch_us(row.expires_at)}};
}

asio::awaitable<result<std::optional<Ownership>>> MemoryStore::replace_expired(
    const ClaimRequest& req, std::int64_t seen_fence) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::optional<Ownership>>();
  auto it = rows_.find(Key{req.id.tenant, req.id.endpoint, req.id.key});
  if (it == rows_.end()) co_return std::optional<Ownership>{};
  Row& row = *it->second;
  const auto now = now_();
  const bool lease_free = row.state == State::completed ||
                          (row.lease_expires_at && *row.lease_expires_at <= now);
  if (row.fence != seen_fence || row.expires_at > now || !lease_free) {
    co_return std::optional<Ownership>{};
  }
  Row fresh;
  fresh.fingerprint = req.fingerprint;
  fresh.principal = req.principal;
  fresh.state = State::in_progress;
  fresh.attempt = row.attempt + 1;
  fresh.fence = ++last_fence_;
  fresh.lease_expires_at = now + req.lease;
  fresh.created_at = now;
  fresh.expires_at = now + std::max(req.retention, req.lease);
  fresh.operation_registered = row.operation_registered;  // an UPDATE keeps the entry
  row = std::move(fresh);
  co_return std::optional<Ownership>{
      Ownership{row.attempt, row.fence, epoch_us(row.created_at), epoch_us(row.expires_at)}};
}

asio::awaitable<result<Completed>> MemoryStore::complete(const RecordId& id, std::int64_t fence,
                                                          const StoredResponse& response,
                                                          Millis retention) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<Completed>();
  auto it = rows_.find(Key{id.tenant, id.endpoint, id.key});
  if (it == rows_.end()) co_return Completed{Completion::fenced, 0};
  Row& row = *it->second;
  // As stored: an omitted body is kept as none (PostgreSQL stores NULL).
  StoredResponse kept = response;
  if (kept.body_omitted) kept.body.clear();
  if (row.fence != fence) co_return Completed{Completion::fenced, 0};
  if (row.state == State::completed) {
    if (row.response != kept) co_return Completed{Completion::fenced, 0};
    co_return Completed{Completion::already_recorded, epoch_us(row.expires_at)};
  }
  const auto now = now_();
  row.state = State::completed;
  row.response = std::move(kept);
  row.completed_at = now;
  row.expires_at = now + retention;
  row.lease_expires_at.reset();
  co_return Completed{Completion::recorded, epoch_us(row.expires_at)};
}

// The row of `id` while the holder of `fence` owns it (in progress, same fencing token);
// rows_.end() otherwise. The caller holds the mutex.
MemoryStore::Rows::iterator MemoryStore::find_owned(const RecordId& id, std::int64_t fence) {
  auto it = rows_.find(Key{id.tenant, id.endpoint, id.key});
  if (it == rows_.end()) return it;
  const Row& row = *it->second;
  return row.state == State::in_progress && row.fence == fence ? it : rows_.end();
}

asio::awaitable<result<bool>> MemoryStore::release(const RecordId& id, std::int64_t fence) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<bool>();
  auto it = find_owned(id, fence);
  if (it == rows_.end()) co_return false;
  rows_.erase(it);
  co_return true;
}

asio::awaitable<result<bool>> MemoryStore::renew(const RecordId& id, std::int64_t fence,
                                                 Millis lease) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<bool>();
  auto it = find_owned(id, fence);
  if (it == rows_.end()) co_return false;
  Row& row = *it->second;
  const auto now = now_();
  row.lease_expires_at = now + lease;
  row.expires_at = std::max(row.expires_at, now + lease);
  co_return true;
}

asio::awaitable<result<bool>> MemoryStore::expire_lease(const RecordId& id,
                                                        std::int64_t fence) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<bool>();
  auto it = find_owned(id, fence);
  if (it == rows_.end()) co_return false;
  it->second->lease_expires_at = now_();
  co_return true;
}

asio::awaitable<result<bool>> MemoryStore::purge(const RecordId& id) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<bool>();
  co_return rows_.erase(Key{id.tenant, id.endpoint, id.key}) == 1;
}

// The upsert of kNotePayloadSql, under the store's one lock.
asio::awaitable<result<PayloadSeen>> MemoryStore::note_payload(const PayloadNote& note) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<PayloadSeen>();
  const auto now = now_();
  const Note fresh{note.operation_id, note.key_hash, now,
                   now + std::chrono::duration_cast<Clock::duration>(note.window)};
  auto [it, inserted] = notes_.try_emplace({note.tenant, note.endpoint, note.principal, note.fingerprint}, fresh);
  PayloadSeen seen;
  if (inserted) co_return seen;
  Note& row = it->second;
  const bool live = row.expires_at > now;
  seen.detected = live && row.operation_id != note.operation_id;
  if (seen.detected) {
    seen.earlier_operation_id = row.operation_id;
    seen.earlier_key_hash = row.key_hash;
    seen.age = std::chrono::floor<Millis>(now - row.seen_at);
  }
  if (!(note.keep_earlier && seen.detected)) row = fresh;
  co_return seen;
}

std::size_t MemoryStore::payload_notes() const {
  std::lock_guard lock(mutex_);
  return notes_.size();
}

asio::awaitable<result<std::size_t>> MemoryStore::delete_expired(std::size_t batch) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::size_t>();
  const auto now = now_();
  std::size_t notes_deleted = 0;
  for (auto it = notes_.begin(); it != notes_.end() && notes_deleted < batch;) {
    if (it->second.expires_at <= now) {
      it = notes_.erase(it);
      ++notes_deleted;
    } else {
      ++it;
    }
  }
  std::size_t deleted = 0;
  for (auto it = rows_.begin(); it != rows_.end() && deleted < batch;) {
    const Row& row = *it->second;
    const bool lease_free = row.state == State::completed ||
                            (row.lease_expires_at && *row.lease_expires_at <= now);
    if (row.expires_at <= now && lease_free) {
      it = rows_.erase(it);
      ++deleted;
    } else {
      ++it;
    }
  }
  co_return deleted;
}

asio::awaitable<result<std::optional<Millis>>> MemoryStore::oldest_in_progress_age() {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::optional<Millis>>();
  std::optional<Clock::time_point> oldest;
  for (const auto& [key, row] : rows_) {
    if (row->state == State::in_progress && (!oldest || row->created_at < *oldest)) {
      oldest = row->created_at;
    }
  }
  if (!oldest) co_return std::optional<Millis>{};
  co_return std::optional<Millis>{std::chrono::ceil<Millis>(now_() - *oldest)};
}

asio::awaitable<result<bool>> MemoryStore::register_operation(const RecordId& id,
                                                             std::string_view operation_id) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<bool>();
  auto it = rows_.find(Key{id.tenant, id.endpoint, id.key});
  if (it == rows_.end()) co_return false;
  it->second->operation_registered = true;
  operations_[{id.tenant, std::string(operation_id)}] = it->first;
  co_return true;
}

asio::awaitable<result<std::optional<OperationRecord>>> MemoryStore::find_operation(
    std::string_view tenant, std::string_view operation_id) {
  std::lock_guard lock(mutex_);
  if (unavailable_) co_return unavailable<std::optional<OperationRecord>>();
  auto op = operations_.find({std::string(tenant), std::string(operation_id)});
  if (op == operations_.end()) co_return std::optional<OperationRecord>{};
  auto it = rows_.find(op->second);
  if (it == rows_.end() || !it->second->operation_registered) {
    operations_.erase(op);  // its record went, and the entry with it
    co_return std::optional<OperationRecord>{};
  }
  const auto& [t, endpoint, key] = it->first;
  co_return std::optional<OperationRecord>{
      OperationRecord{RecordId{t, endpoint, key}, record_of(*it->second, now_())}};
}

}  // namespace idem::store
