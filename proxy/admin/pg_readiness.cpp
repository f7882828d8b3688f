// Readiness against PostgreSQL. Lives apart from the handler so the handler's unit tests
// need no database: they inject their own probe.
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "admin/admin.hpp"
#include "observability/metrics.hpp"
#include "pg/pool.hpp"
#include "pg/result.hpp"
#include "store/migrations.hpp"

namespace idem::admin {
namespace {

Readiness not_ready(std::string reason, std::string detail) {
  return Readiness{false, std::move(reason), std::move(detail)};
}

// What the probe last said about a newer schema, so the log says it once per change of
// the database's version rather than on every probe.
struct SchemaMemory {
  std::atomic<int> logged_version{0};
};

// A newer schema that allows this binary: ready, said once in the log and always in the
// metrics; one that does not: unready with a reason of its own, so a rollback that went
// one release too far is told apart from a database that is simply behind.
Readiness judge(const store::SchemaCheck& check, obs::Metrics* metrics, SchemaMemory& memory) {
  const bool newer = check.status == store::SchemaStatus::newer_compatible;
  if (metrics) metrics->set_schema(check.binary_version, check.database_version, newer);
  if (newer) {
    if (memory.logged_version.exchange(check.database_version) != check.database_version) {
      spdlog::warn("readiness: {}: serving (the rolling upgrade under way replaces this replica)",
                   check.detail);
    }
    return Readiness{true, "schema_newer_compatible", check.detail};
  }
  memory.logged_version.store(0);
  switch (check.status) {
    case store::SchemaStatus::current: return Readiness{true, "ready", {}};
    case store::SchemaStatus::behind: return not_ready("schema_behind", check.detail);
    case store::SchemaStatus::incompatible: return not_ready("schema_incompatible", check.detail);
    case store::SchemaStatus::mismatch:
    case store::SchemaStatus::newer_compatible: break;
  }
  return not_ready("schema_mismatch", check.detail);
}

// The parameters are copies: the coroutine outlives the std::function call that made it.
asio::awaitable<Readiness> probe_schema(std::shared_ptr<pg::Pool> pool, Millis deadline,
                                        obs::Metrics* metrics,
                                        std::shared_ptr<SchemaMemory> memory) {
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
  std::vector<store::AppliedMigration> applied;
  applied.reserve(static_cast<std::size_t>(rows.rows()));
  for (int i = 0; i < rows.rows(); ++i) {
    const auto version = rows.int64(i, 0);
    if (!version) co_return not_ready("store_error", "unreadable idemproxy_schema_migrations row");
    store::AppliedMigration a;
    a.version = static_cast<int>(*version);
    a.checksum = std::string(rows.value(i, 1));
    if (!rows.is_null(i, 2)) {
      const auto from = rows.int64(i, 2);
      if (!from) co_return not_ready("store_error", "unreadable compatible_from in idemproxy_schema_migrations");
      a.compatible_from = static_cast<int>(*from);
    }
    a.name = std::string(rows.value(i, 3));
    applied.push_back(std::move(a));
  }
  co_return judge(store::compare_schema(applied), metrics, *memory);
}

}  // namespace

ReadinessProbe pg_readiness(std::shared_ptr<pg::Pool> pool, Millis deadline, obs::Metrics* metrics) {
  auto memory = std::make_shared<SchemaMemory>();
  return [pool = std::move(pool), deadline, metrics, memory] {
    return probe_schema(pool, deadline, metrics, memory);
  };
}

}  // namespace idem::admin
