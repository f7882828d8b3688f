#pragma once
// One-dimensional PostgreSQL arrays in the binary wire format (array_send/array_recv), as
// statement parameters for the batched statements (`unnest($1::text[], ...)`).
//
// Binary rather than text: a text array literal needs quoting and escaping of every
// element (and hex for bytea, doubling a stored body), each a chance to get a byte wrong;
// the binary form carries every element as length + bytes, exactly. The element type's
// OID is part of the format and the server checks it against the parameter's declared
// type (`$n::text[]`), so a mismatch is an error, never a misread.
#include <cstdint>
#include <string>
#include <string_view>

#include "pg/pool.hpp"

namespace idem::store::detail {

class ArrayParam {
 public:
  // Element types, by their fixed OIDs (pg_type.dat): the ones the batches use.
  enum class Type : std::uint32_t { boolean = 16, bytea = 17, int8 = 20, int4 = 23, text = 25, tid = 27 };

  explicit ArrayParam(Type type) : type_(type) {}

  void add_text(std::string_view s);   // text or bytea: the bytes as they are
  void add_int64(std::int64_t v);
  void add_int32(std::int32_t v);
  void add_bool(bool v);
  // A row's physical address (ctid): block number, then offset in the block (tidsend).
  void add_tid(std::uint32_t block, std::uint16_t offset);
  void add_null();

  std::size_t size() const noexcept { return count_; }
  // The encoded array, built on each call; the parameter views `storage`.
  pg::Param param(std::string& storage) const;

 private:
  void length(std::int32_t n);

  Type type_;
  std::int32_t count_ = 0;
  bool has_null_ = false;
  std::string elements_;  // each: int32 length (-1 = NULL), then the bytes
};

}  // namespace idem::store::detail
