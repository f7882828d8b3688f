// Readiness against PostgreSQL. Lives apart from the handler so the handler's unit tests
// need no database: they inject their own probe.
#include <string>
#include <utility>
#include <vector>

#include "admin/admin.hpp"
#include "pg/pool.hpp"
#include "pg/result.hpp"
#include "store/migrations.hpp"

namespace idem::admin {
namespace {

Readiness not_ready(std::string reason, std::string detail) {
  return Readiness{false, std::move(reason), std::move(detail)};
}

// The parameters are copies: the coroutine outlives the std::function call that made it.
asio::awaitable<Readiness> probe_schema(std::shared_ptr<pg::Pool> pool, Millis deadline) {
  // The same question `serve` asks at start-up, through the worker's pool: a probe that
  // succeeds proves a pooled connection can be had, prepared and used right now. (A fresh
  // database fails at the session setup, whose prepared statements name the missing table:
  // the same SQLSTATE as the query itself.)
  auto op = pool->query(store::kSchemaQuery);
  auto r = co_await within(deadline, std::move(op));
  if (!r) {
    co_return not_ready("store_timeout", "PostgreSQL did not answer within " +
                                             std::to_string(deadline.count()) + "ms");
  }
  if (!*r) {
    const auto& ec = r->error();
    if (pg::sqlstate(ec) == "42P01") {  // undefined_table: never migrated
      co_return not_ready("schema_behind",
                          "the idemproxy tables do not exist; run `idemproxy migrate`");
    }
    // The error code's message only: the server's text may quote connection details.
    switch (pg::to_store_errc(ec)) {
      case errc::store_unavailable: co_return not_ready("store_unavailable", ec.message());
      case errc::store_timeout: co_return not_ready("store_timeout", ec.message());
      case errc::store_busy: co_return not_ready("store_busy", ec.message());
      default: co_return not_ready("store_error", ec.message());
    }
  }
  const pg::Result& rows = r->value();
  std::vector<std::pair<int, std::string>> applied;
  applied.reserve(static_cast<std::size_t>(rows.rows()));
  for (int i = 0; i < rows.rows(); ++i) {
    const auto version = rows.int64(i, 0);
    if (!version) co_return not_ready("store_error", "unreadable idemproxy_schema_migrations row");
    applied.emplace_back(static_cast<int>(*version), std::string(rows.value(i, 1)));
  }
  const auto check = store::compare_schema(applied);
  switch (check.status) {
    case store::SchemaStatus::current: co_return Readiness{true, "ready", {}};
    case store::SchemaStatus::behind: co_return not_ready("schema_behind", check.detail);
    case store::SchemaStatus::mismatch: co_return not_ready("schema_mismatch", check.detail);
  }
  co_return not_ready("schema_mismatch", check.detail);
}

}  // namespace

ReadinessProbe pg_readiness(std::shared_ptr<pg::Pool> pool, Millis deadline) {
  return [pool = std::move(pool), deadline] { return probe_schema(pool, deadline); };
}

}  // namespace idem::admin
