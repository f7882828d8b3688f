#pragma once
// A Store decorator that keeps answers encrypted at rest (store/record_cipher.hpp): it
// seals what complete() writes and opens what claim() and read() return, and passes every
// other call through. The sidecar puts it between its replay cache and PostgreSQL
// (CachingStore -> EncryptingStore -> PgStore), so the cache holds plaintext in memory
// only and PostgreSQL never sees any.
//
// A record that does not open (a key id not in the ring, a changed byte, a sealed answer
// copied from another record) reads as a store protocol error: the request gets 503 and
// the log names the record by its key hash, never its content. Records written in clear
// (before encryption was enabled, or by a backend: completion: backend) read as they are.
#include <functional>
#include <memory>

#include "store/record_cipher.hpp"
#include "store/store.hpp"

namespace idem::gateway {

// The key ring to use now: a reload (SIGHUP) swaps it whole, so each call takes one
// snapshot and seals or opens with it. Never null.
using KeyRingSource = std::function<std::shared_ptr<const store::KeyRing>()>;

class EncryptingStore final : public store::Store {
 public:
  EncryptingStore(store::Store& inner, KeyRingSource ring);

  asio::awaitable<result<store::ClaimResult>> claim(const store::ClaimRequest& req) override;
  asio::awaitable<result<std::optional<store::Record>>> read(const store::RecordId& id) override;
  asio::awaitable<result<std::optional<store::Ownership>>> take_over(const store::RecordId& id, std::int64_t seen_fence,
                                                              Millis lease) override;
  asio::awaitable<result<std::optional<store::Ownership>>> replace_expired(const store::ClaimRequest& req,
                                                                    std::int64_t seen_fence) override;
  asio::awaitable<result<store::Completed>> complete(const store::RecordId& id, std::int64_t fence,
                                              const store::StoredResponse& response, Millis retention) override;
  asio::awaitable<result<bool>> release(const store::RecordId& id, std::int64_t fence) override;
  asio::awaitable<result<bool>> renew(const store::RecordId& id, std::int64_t fence, Millis lease) override;
  asio::awaitable<result<bool>> expire_lease(const store::RecordId& id, std::int64_t fence) override;
  asio::awaitable<result<bool>> purge(const store::RecordId& id) override;
  asio::awaitable<result<store::PayloadSeen>> note_payload(const store::PayloadNote& note) override;
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) override;
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override;
  asio::awaitable<result<bool>> register_operation(const store::RecordId& id,
                                                   std::string_view operation_id) override;
  // The status resource's record: opened like a read's (a completed one may be replayed).
  asio::awaitable<result<std::optional<store::OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) override;

 private:
  // Opens the row's answer in place; false when it does not open.
  bool open_row(const store::RecordId& id, store::Record& row) const;

  store::Store& inner_;
  KeyRingSource ring_;
};

}  // namespace idem::gateway
