#include "common/errors.hpp"

namespace idem {
namespace {

class IdemCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "idemproxy"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::store_unavailable: return "store unavailable";
      case errc::store_timeout: return "store timed out";
      case errc::store_busy: return "store connection pool exhausted";
      case errc::store_protocol: return "unexpected store response";
      case errc::schema_behind: return "database schema is behind this binary";
      case errc::schema_mismatch: return "database schema does not match this binary";
    }
    return "unknown idemproxy error";
  }
};

}  // namespace

const boost::system::error_category& idem_category() noexcept {
  static const IdemCategory category;
  return category;
}

}  // namespace idem
