#pragma once
// The PostgreSQL Store: every operation is one prepared statement on a pooled async
// connection (one round trip; a claim may carry the loser's read in the same round trip),
// scoped by the full primary key, decided by now().
// Errors are idem::errc (see pg::to_store_errc for the SQLSTATE mapping); the pool's
// last_error_message() has the server's text for logs.
//
// Like the pool, a PgStore belongs to one io_context thread (its batches may be another
// store's, on another thread: the second constructor). It must outlive the start of
// each call; a call in flight keeps the pool alive by itself. Request arguments (ids,
// bodies) are referenced, not copied: keep them alive until the call completes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "pg/pool.hpp"
#include "store/store.hpp"

namespace idem::store {

// Group commit (database.batching): the claims, the completions, the releases and the
// lease renewals of concurrent requests on this store's event loop (and on the loops of
// the stores sharing its batchers) go out together, one
// statement and one commit per batch of each kind (natural batching: the next batch
// forms while one is in flight; a lone call goes out at once). Each call still gets exactly what its own statement would have
// answered, and each claim is committed before claim() returns. A batch the server
// refuses (an SQL error: nothing of it was committed) is retried call by call, so one
// call that cannot succeed never fails the others; a batch that timed out or lost its
// connection fails each of its calls as a single call would have failed.
struct PgBatching {
  bool enabled = true;
  std::size_t max_size = 32;  // calls per batch
  // A lone call normally keeps its single statement (the cheaper plan for one row); the
  // tests set this to run every call through the batch statements.
  bool lone_calls_batched = false;
  // Told of every batch statement sent: "claim", "complete", "release" or "renew", and
  // how many calls it carried (for metrics). Runs on the store's thread; may be empty.
  std::function<void(std::string_view op, std::size_t calls)> on_batch;
};

class PgStore final : public Store {
 public:
  // When claim() also reads the row, in the same round trip, for the caller to use if the
  // claim is lost (ClaimResult::row): saves a duplicate one round trip, costs a winner
  // a discarded read. `adaptive` reads along only while lost claims are common (more than
  // one in eight of the recent ones, e.g. during a retry storm); `always`/`never` pin it.
  enum class ClaimRead { adaptive, always, never };

  using Batching = PgBatching;

  // The pool must have been created with pg_store_statements() prepared on each connection.
  explicit PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read = ClaimRead::adaptive,
                   Batching batching = {});
  // A store on another event loop whose batched calls join `home`'s batches (one batcher
  // per process: every worker's calls share the statements and commits). The batches run
  // on home's loop with home's pool; this store's own pool serves everything else and the
  // calls a batch sends back to run alone. With batching off at home, nothing is batched.
  PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read, const PgStore& home);

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
  asio::awaitable<result<bool>> register_operation(const RecordId& id,
                                                   std::string_view operation_id) override;
  asio::awaitable<result<std::optional<OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) override;

  // How many claim, completion, release and renewal statements were sent as batches, and how many calls
  // they carried (calls sent alone are not counted): for tests and measurements.
  struct BatchStats {
    std::uint64_t claim_batches = 0;
    std::uint64_t claims_batched = 0;
    std::uint64_t completion_batches = 0;
    std::uint64_t completions_batched = 0;
    // Of those, sent with the row address their claim returned, and of these, how many
    // were not found there (the row had moved) and ran again alone by their key.
    std::uint64_t completions_by_row = 0;
    std::uint64_t completions_moved = 0;
    // Completions sent alone (not counted above) with their claim's row address, and of
    // these, how many were not found there and went by their key.
    std::uint64_t completions_alone_by_row = 0;
    std::uint64_t completions_alone_moved = 0;
    std::uint64_t release_batches = 0;
    std::uint64_t releases_batched = 0;
    std::uint64_t renewal_batches = 0;
    std::uint64_t renewals_batched = 0;
    std::uint64_t batches_refused = 0;  // refused by the server, retried call by call
    // Write cycles that carried claims and completions together (one commit for both).
    std::uint64_t combined_cycles = 0;
  };
  BatchStats batch_stats() const noexcept;

  // Shared with the calls and batches in flight (the store itself need only outlive the
  // start of a call): the pool, the claim-read policy and its statistics.
  struct Core;
  struct Batchers;
  struct HeldClaims;

 private:
  asio::awaitable<result<Completed>> complete_held(const RecordId& id, std::int64_t fence,
                                                    const StoredResponse& response,
                                                    Millis retention);
  static std::shared_ptr<Batchers> make_batchers(const std::shared_ptr<Core>& core,
                                                 std::size_t max_size);

  std::shared_ptr<Core> core_;
  std::shared_ptr<HeldClaims> held_;    // shared by every store of the process
  std::shared_ptr<Batchers> batchers_;  // null when batching is off
  bool remote_ = false;                 // batchers_ are another loop's (the home store's)
};

// The statements PgStore uses, to be prepared on every pooled connection.
const std::vector<pg::PreparedStatement>& pg_store_statements();

// The planner settings PgStore's sessions run with (pg_store.cpp says why).
const std::vector<pg::SessionSetting>& pg_store_session_settings();

// "idemproxy schema=8": the application_name of the replica's sessions (`role` first).
std::string replica_application_name(std::string_view role);

// Pool options for a PgStore: pg_store_statements() and pg_store_session_settings() on
// every connection, acquire_timeout = statement_timeout.
pg::PoolOptions pg_store_pool_options(std::string conninfo, std::size_t size,
                                      Millis connect_timeout, Millis statement_timeout);

}  // namespace idem::store
