#pragma once
// The PostgreSQL Store: every operation is one prepared statement on a pooled async
// connection (one round trip; a claim may carry the loser's read in the same round trip),
// scoped by the full primary key, decided by now().
// Errors are idem::errc (see pg::to_store_errc for the SQLSTATE mapping); the pool's
// last_error_message() has the server's text for logs.
//
// Like the pool, a PgStore belongs to one io_context thread. It must outlive the start of
// each call; a call in flight keeps the pool alive by itself. Request arguments (ids,
// bodies) are referenced, not copied: keep them alive until the call completes.
#include <memory>

#include "pg/pool.hpp"
#include "store/store.hpp"

namespace idem::store {

class PgStore final : public Store {
 public:
  // When claim() also reads the row, in the same round trip, for the caller to use if the
  // claim is lost (ClaimResult::row): saves a duplicate one round trip, costs a winner
  // a discarded read. `adaptive` reads along only while lost claims are common (more than
  // one in eight of the recent ones, e.g. during a retry storm); `always`/`never` pin it.
  enum class ClaimRead { adaptive, always, never };

  // The pool must have been created with pg_store_statements() prepared on each connection.
  explicit PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read = ClaimRead::adaptive);

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
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) override;
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override;
  asio::awaitable<result<bool>> register_operation(const RecordId& id,
                                                   std::string_view operation_id) override;
  asio::awaitable<result<std::optional<OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) override;

 private:
  bool read_with_claim() const noexcept;

  std::shared_ptr<pg::Pool> pool_;
  ClaimRead claim_read_;
  // Exponentially weighted share of recent claims that were lost (0..1). Shared with the
  // calls in flight, which update it after their round trip (the store itself need only
  // outlive the start of a call).
  std::shared_ptr<double> lost_share_ = std::make_shared<double>(0.0);
};

// The statements PgStore uses, to be prepared on every pooled connection.
const std::vector<pg::PreparedStatement>& pg_store_statements();

}  // namespace idem::store
