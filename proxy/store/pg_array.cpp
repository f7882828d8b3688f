#include "store/pg_array.hpp"

namespace idem::store::detail {
namespace {

// Network byte order, as every integer of the binary protocol.
void put32(std::string& out, std::uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out.append(b, 4);
}

void put64(std::string& out, std::uint64_t v) {
  put32(out, static_cast<std::uint32_t>(v >> 32));
  put32(out, static_cast<std::uint32_t>(v));
}

}  // namespace

void ArrayParam::length(std::int32_t n) {
  put32(elements_, static_cast<std::uint32_t>(n));
  ++count_;
}

void ArrayParam::add_text(std::string_view s) {
  length(static_cast<std::int32_t>(s.size()));
  elements_.append(s);
}

void ArrayParam::add_int64(std::int64_t v) {
  length(8);
  put64(elements_, static_cast<std::uint64_t>(v));
}

void ArrayParam::add_int32(std::int32_t v) {
  length(4);
  put32(elements_, static_cast<std::uint32_t>(v));
}

void ArrayParam::add_bool(bool v) {
  length(1);
  elements_.push_back(v ? 1 : 0);
}

void ArrayParam::add_tid(std::uint32_t block, std::uint16_t offset) {
  length(6);
  put32(elements_, block);
  elements_.push_back(static_cast<char>(offset >> 8));
  elements_.push_back(static_cast<char>(offset));
}

void ArrayParam::add_null() {
  length(-1);
  has_null_ = true;
}

// Header: ndim, has-null flag, element type OID, then per dimension its length and lower
// bound. An empty array is written with ndim 0 and no dimensions, as the server writes it.
pg::Param ArrayParam::param(std::string& storage) const {
  storage.clear();
  storage.reserve(20 + elements_.size());
  put32(storage, count_ == 0 ? 0 : 1);
  put32(storage, has_null_ ? 1 : 0);
  put32(storage, static_cast<std::uint32_t>(type_));
  if (count_ > 0) {
    put32(storage, static_cast<std::uint32_t>(count_));
    put32(storage, 1);
    storage.append(elements_);
  }
  return pg::Param::bytes(storage);
}

}  // namespace idem::store::detail
