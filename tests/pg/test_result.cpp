// Error codes and text decoders of the pg layer: no server needed.
#include <doctest/doctest.h>

#include "pg/result.hpp"

using namespace idem;

TEST_CASE("SQLSTATE codes round-trip through error_code") {
  for (const char* state : {"00001", "08006", "22012", "23505", "40P01", "57014", "57P01",
                            "XX000", "ZZZZZ"}) {
    const error_code ec = pg::make_sqlstate_error(state);
    CHECK(ec);
    CHECK(ec.category() == pg::sqlstate_category());
    CHECK(pg::sqlstate(ec) == state);
    CHECK(ec.message().find(state) != std::string::npos);
  }
  CHECK(pg::sqlstate(make_error_code(pg::errc::timeout)).empty());
  // Malformed states do not become server errors.
  CHECK(pg::make_sqlstate_error("abc") == pg::errc::protocol);
  CHECK(pg::make_sqlstate_error("2201a") == pg::errc::protocol);
}

TEST_CASE("errors fold into the store-level codes by SQLSTATE, never by text") {
  auto store = [](std::string_view state) {
    return pg::to_store_errc(pg::make_sqlstate_error(state));
  };
  CHECK(store("08006") == errc::store_unavailable);  // connection_failure
  CHECK(store("08003") == errc::store_unavailable);  // connection_does_not_exist
  CHECK(store("57P01") == errc::store_unavailable);  // admin_shutdown
  CHECK(store("57P02") == errc::store_unavailable);  // crash_shutdown
  CHECK(store("57P03") == errc::store_unavailable);  // cannot_connect_now
  CHECK(store("53300") == errc::store_unavailable);  // too_many_connections
  CHECK(store("57014") == errc::store_timeout);      // query_canceled
  CHECK(store("55P03") == errc::store_timeout);      // lock_not_available
  CHECK(store("23505") == errc::store_protocol);     // unique_violation
  CHECK(store("42P01") == errc::store_protocol);     // undefined_table
  CHECK(store("40P01") == errc::store_protocol);     // deadlock_detected

  using pg::errc;
  CHECK(pg::to_store_errc(make_error_code(errc::connection_failed)) == idem::errc::store_unavailable);
  CHECK(pg::to_store_errc(make_error_code(errc::connection_lost)) == idem::errc::store_unavailable);
  CHECK(pg::to_store_errc(make_error_code(errc::pool_closed)) == idem::errc::store_unavailable);
  CHECK(pg::to_store_errc(make_error_code(errc::timeout)) == idem::errc::store_timeout);
  CHECK(pg::to_store_errc(make_error_code(errc::cancelled)) == idem::errc::store_timeout);
  CHECK(pg::to_store_errc(make_error_code(errc::pool_exhausted)) == idem::errc::store_busy);
  CHECK(pg::to_store_errc(make_error_code(errc::protocol)) == idem::errc::store_protocol);
  CHECK(pg::to_store_errc(make_error_code(errc::invalid_parameter)) == idem::errc::store_protocol);
  // Store codes pass through unchanged.
  CHECK(pg::to_store_errc(make_error_code(idem::errc::store_busy)) == idem::errc::store_busy);
}

TEST_CASE("text decoders") {
  CHECK(pg::parse_int64("0") == 0);
  CHECK(pg::parse_int64("-9223372036854775808") == INT64_MIN);
  CHECK(pg::parse_int64("9223372036854775807") == INT64_MAX);
  CHECK_FALSE(pg::parse_int64("9223372036854775808"));
  CHECK_FALSE(pg::parse_int64(""));
  CHECK_FALSE(pg::parse_int64("12x"));
  CHECK_FALSE(pg::parse_int64(" 1"));

  CHECK(pg::parse_bool("t") == true);
  CHECK(pg::parse_bool("f") == false);
  CHECK(pg::parse_bool("true") == true);
  CHECK_FALSE(pg::parse_bool("yes"));

  CHECK(pg::decode_bytea_hex("\\x") == std::string());
  CHECK(pg::decode_bytea_hex("\\x00ff41") == std::string("\0\xff" "A", 3));
  CHECK(pg::decode_bytea_hex("\\x00FF") == std::string("\0\xff", 2));
  CHECK_FALSE(pg::decode_bytea_hex("\\x0"));       // odd length
  CHECK_FALSE(pg::decode_bytea_hex("\\x0g"));      // not hex
  CHECK_FALSE(pg::decode_bytea_hex("\\000"));      // escape format is refused
  CHECK_FALSE(pg::decode_bytea_hex(""));
}

TEST_CASE("an empty Result has no rows") {
  pg::Result r;
  CHECK_FALSE(r);
  CHECK(r.rows() == 0);
  CHECK(r.columns() == 0);
  CHECK(r.affected_rows() == 0);
  CHECK(r.column("x") == -1);
  pg::Result moved = std::move(r);
  CHECK_FALSE(moved);
}
