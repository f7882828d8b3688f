#pragma once
// In-memory Store for unit tests of the gateway. Same semantics as PgStore (proven by the
// shared conformance suite in tests/store/), with an injectable clock. Thread-safe.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <tuple>

#include "store/store.hpp"

namespace idem::store {

class MemoryStore final : public Store {
 public:
  using Clock = std::chrono::system_clock;
  using Now = std::function<Clock::time_point()>;

  explicit MemoryStore(Now now = [] { return Clock::now(); });

  // Test switch: every call fails with errc::store_unavailable while set.
  void set_unavailable(bool unavailable);
  std::size_t size() const;

  asio::awaitable<result<ClaimResult>> claim(const ClaimRequest& req) override;
  asio::awaitable<result<std::optional<Record>>> read(const RecordId& id) override;
  asio::awaitable<result<std::optional<Ownership>>> take_over(const RecordId& id,
                                                              std::int64_t seen_fence,
                                                              Millis lease) override;
  asio::awaitable<result<std::optional<Ownership>>> replace_expired(
      const ClaimRequest& req, std::int64_t seen_fence) override;
  asio::awaitable<result<Completed>> complete(const RecordId& id, std::int64_t fence,
                                               const StoredResponse& response,
                                               Millis retention) override;
  asio::awaitable<result<bool>> release(const RecordId& id, std::int64_t fence) override;
  asio::awaitable<result<bool>> renew(const RecordId& id, std::int64_t fence,
                                      Millis lease) override;
  asio::awaitable<result<bool>> expire_lease(const RecordId& id, std::int64_t fence) override;
  asio::awaitable<result<bool>> purge(const RecordId& id) override;
  asio::awaitable<result<PayloadSeen>> note_payload(const PayloadNote& note) override;
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) override;
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override;
  std::size_t payload_notes() const;  // tests: notes held, expired ones included
  asio::awaitable<result<bool>> register_operation(const RecordId& id,
                                                   std::string_view operation_id) override;
  asio::awaitable<result<std::optional<OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) override;

 private:
  struct Row;
  using Key = std::tuple<std::string, std::string, std::string>;
  using Rows = std::map<Key, std::shared_ptr<Row>>;
  Rows::iterator find_owned(const RecordId& id, std::int64_t fence);
  static Record record_of(const Row& row, Clock::time_point now);
  Now now_;
  mutable std::mutex mutex_;
  Rows rows_;
  std::map<std::pair<std::string, std::string>, Key> operations_;  // (tenant, operation id)
  struct Note {
    std::string operation_id;
    std::string key_hash;
    Clock::time_point seen_at;
    Clock::time_point expires_at;
  };
  // (tenant, endpoint, principal, fingerprint): the idempotency_same_payload table.
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Note> notes_;
  // The counterpart of the idempotency_fencing_tokens sequence: one counter for every key,
  // never reset, so a token is never handed out twice.
  std::int64_t last_fence_ = 0;
  bool unavailable_ = false;
};

}  // namespace idem::store
