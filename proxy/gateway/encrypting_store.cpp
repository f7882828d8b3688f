// Encryption at rest as a Store decorator (encrypting_store.hpp).
#include "gateway/encrypting_store.hpp"

#include <spdlog/spdlog.h>

#include "idempotency/fingerprint.hpp"

namespace idem::gateway {
namespace {

error_code unreadable() { return make_error_code(errc::store_protocol); }

}  // namespace

EncryptingStore::EncryptingStore(store::Store& inner, KeyRingSource ring)
    : inner_(inner), ring_(std::move(ring)) {}

bool EncryptingStore::open_row(const store::RecordId& id, store::Record& row) const {
  if (!row.response) return true;
  store::OpenError why = store::OpenError::invalid;
  const auto ring = ring_();
  auto opened = store::open(*ring, id, *row.response, &why);
  if (!opened) {
    // The key hash, as the access log names keys: never the tenant, key or content.
    spdlog::error("record {} could not be decrypted: {}", idempotency::log_hash(id.tenant, id.key),
                  why == store::OpenError::unknown_key ? "it was sealed with a key id that is not in encryption.keys"
                                                : "authentication failed (another key, or the row was changed or "
                                                  "copied from another record)");
    return false;
  }
  row.response = std::move(*opened);
  return true;
}

asio::awaitable<result<store::ClaimResult>> EncryptingStore::claim(const store::ClaimRequest& req) {
  auto r = co_await inner_.claim(req);
  if (r && r->row && !open_row(req.id, *r->row)) co_return result<store::ClaimResult>(boost::system::in_place_error, unreadable());
  co_return r;
}

asio::awaitable<result<std::optional<store::Record>>> EncryptingStore::read(const store::RecordId& id) {
  auto r = co_await inner_.read(id);
  if (r && *r && !open_row(id, **r)) {
    co_return result<std::optional<store::Record>>(boost::system::in_place_error, unreadable());
  }
  co_return r;
}

asio::awaitable<result<store::Completed>> EncryptingStore::complete(const store::RecordId& id, std::int64_t fence,
                                                             const store::StoredResponse& response, Millis retention) {
  const auto ring = ring_();
  co_return co_await inner_.complete(id, fence, store::seal(*ring, id, response), retention);
}

asio::awaitable<result<std::optional<store::Ownership>>> EncryptingStore::take_over(const store::RecordId& id,
                                                                             std::int64_t seen_fence, Millis lease) {
  co_return co_await inner_.take_over(id, seen_fence, lease);
}

asio::awaitable<result<std::optional<store::Ownership>>> EncryptingStore::replace_expired(const store::ClaimRequest& req,
                                                                                   std::int64_t seen_fence) {
  co_return co_await inner_.replace_expired(req, seen_fence);
}

asio::awaitable<result<bool>> EncryptingStore::release(const store::RecordId& id, std::int64_t fence) {
  co_return co_await inner_.release(id, fence);
}

asio::awaitable<result<bool>> EncryptingStore::renew(const store::RecordId& id, std::int64_t fence, Millis lease) {
  co_return co_await inner_.renew(id, fence, lease);
}

asio::awaitable<result<bool>> EncryptingStore::expire_lease(const store::RecordId& id, std::int64_t fence) {
  co_return co_await inner_.expire_lease(id, fence);
}

asio::awaitable<result<bool>> EncryptingStore::purge(const store::RecordId& id) { co_return co_await inner_.purge(id); }

// Hashes and operation ids only: nothing to seal.
asio::awaitable<result<store::PayloadSeen>> EncryptingStore::note_payload(const store::PayloadNote& note) {
  co_return co_await inner_.note_payload(note);
}

asio::awaitable<result<std::size_t>> EncryptingStore::delete_expired(std::size_t batch) {
  co_return co_await inner_.delete_expired(batch);
}

asio::awaitable<result<std::optional<Millis>>> EncryptingStore::oldest_in_progress_age() {
  co_return co_await inner_.oldest_in_progress_age();
}

asio::awaitable<result<bool>> EncryptingStore::register_operation(const store::RecordId& id,
                                                                 std::string_view operation_id) {
  co_return co_await inner_.register_operation(id, operation_id);
}

asio::awaitable<result<std::optional<store::OperationRecord>>> EncryptingStore::find_operation(
    std::string_view tenant, std::string_view operation_id) {
  auto r = co_await inner_.find_operation(tenant, operation_id);
  if (r && *r && !open_row((*r)->id, (*r)->record)) {
    co_return result<std::optional<store::OperationRecord>>(boost::system::in_place_error,
                                                            unreadable());
  }
  co_return r;
}

}  // namespace idem::gateway
