#pragma once
// Error codes of the request path. Expected outcomes (conflict, in progress, fenced)
// are values, not errors; these codes are for failures of the things we depend on.
#include <system_error>

#include "common/types.hpp"

namespace idem {

enum class errc {
  // The store (PostgreSQL) could not be reached or lost the connection.
  store_unavailable = 1,
  // A statement, a connect or a wait for a pooled connection passed its deadline.
  store_timeout,
  // Every pooled connection is busy and none freed up before the deadline.
  store_busy,
  // The store answered something the protocol does not expect (SQL error, bad row).
  store_protocol,
  // The database schema is older than the binary's migrations.
  schema_behind,
  // The database has migrations this binary does not know, or a changed checksum.
  schema_mismatch,
};

const boost::system::error_category& idem_category() noexcept;

inline error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), idem_category()};
}

}  // namespace idem

template <>
struct boost::system::is_error_code_enum<idem::errc> : std::true_type {};
