#include "schema.hpp"

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace idem::demo {
namespace {

struct Migration {
  int version;
  const char* sql;
};

// Forward-only: a released migration is never edited; a change is a new version.

constexpr Migration kOrdersMigrations[] = {
    {1, R"sql(
CREATE TABLE demo_orders.orders (
  order_id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id            text        NOT NULL,
  -- The sidecar's X-Idempotency-Operation-Id. It is unique per tenant only while a retry
  -- of that operation can still arrive (until operation_expires_at, which tracks the
  -- route's retention); after that the same id means a new operation (see docs/demo.md)
  -- and the order keeps it in retired_operation_id. NULL for orders made without the
  -- sidecar.
  operation_id         text,
  operation_expires_at timestamptz,
  retired_operation_id text,
  -- The highest X-Idempotency-Attempt that reached this order. An arrival with a lower
  -- one is a straggler of a superseded attempt and changes nothing.
  attempt              bigint      NOT NULL DEFAULT 0 CHECK (attempt >= 0),
  -- The business key: one order per checkout, forever, whatever the idempotency key.
  checkout_id          text,
  customer_id          text        NOT NULL,
  currency             text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
  amount               bigint      NOT NULL CHECK (amount > 0),       -- minor units
  discount             bigint      NOT NULL CHECK (discount >= 0 AND discount < amount),
  total                bigint      NOT NULL CHECK (total = amount - discount),
  coupon               text,
  items                jsonb       NOT NULL CHECK (jsonb_typeof(items) = 'array'),
  created_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT orders_operation_unique UNIQUE (tenant_id, operation_id),
  CONSTRAINT orders_checkout_unique UNIQUE (tenant_id, checkout_id),
  CHECK (operation_id IS NULL OR operation_expires_at IS NOT NULL)
);

-- The transactional outbox: written in the same statement as its order, delivered at
-- least once by the relay. available_at delays a retry; claimed_until is a relay's lease,
-- so a relay that dies mid-delivery only delays its events.
CREATE TABLE demo_orders.outbox (
  event_id      uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id     text        NOT NULL,
  order_id      uuid        NOT NULL REFERENCES demo_orders.orders (order_id),
  event_type    text        NOT NULL,
  payload       jsonb       NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  available_at  timestamptz NOT NULL DEFAULT now(),
  claimed_until timestamptz,
  attempts      integer     NOT NULL DEFAULT 0,
  delivered_at  timestamptz,
  dead_at       timestamptz,
  last_error    text
);
CREATE INDEX outbox_pending_idx ON demo_orders.outbox (available_at)
  WHERE delivered_at IS NULL AND dead_at IS NULL;

CREATE TABLE demo_orders.coupons (
  code        text        PRIMARY KEY,
  percent_off integer     NOT NULL CHECK (percent_off BETWEEN 1 AND 90),
  expires_at  timestamptz NOT NULL
);
INSERT INTO demo_orders.coupons (code, percent_off, expires_at) VALUES
  ('WELCOME10', 10, '2999-12-31T23:59:59Z'),
  ('SPRING2020', 20, '2020-06-01T00:00:00Z');
)sql"},
    {2, R"sql(
-- Test instrumentation, written only with --record-arrivals (which needs
-- --enable-fault-injection): every POST /orders that reached the API with the sidecar's
-- headers, recorded before it is handled. The sidecar forwards once per claim of a key,
-- so two arrivals of one operation with the same fencing token are two claims that
-- shared a token: what fencing must never allow (scripts/chaos checks it).
CREATE TABLE demo_orders.arrivals (
  arrival_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id     text        NOT NULL,
  operation_id  text        NOT NULL,
  attempt       bigint      NOT NULL,
  fencing_token bigint,     -- X-Idempotency-Fencing-Token; NULL when not sent
  arrived_at    timestamptz NOT NULL DEFAULT now()
);
)sql"},
    {3, R"sql(
-- The body of 201 Created, rendered by the database, once and the same for every attempt
-- that finds the order: a compact JSON object in the documented member order. It is built
-- here rather than in the API so that one statement can create the order, its event and
-- the idempotency record holding this very answer (routes with completion: backend).
CREATE FUNCTION demo_orders.order_body(o demo_orders.orders) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT '{"order_id":' || to_json(o.order_id::text)::text
      || ',"checkout_id":' || coalesce(to_json(o.checkout_id)::text, 'null')
      || ',"customer_id":' || to_json(o.customer_id)::text
      || ',"currency":' || to_json(o.currency)::text
      || ',"amount":' || o.amount::text
      || ',"discount":' || o.discount::text
      || ',"total":' || o.total::text
      || ',"coupon":' || coalesce(to_json(o.coupon)::text, 'null')
      || ',"items":[' || coalesce((
           SELECT string_agg('{"sku":' || to_json(i.item->>'sku')::text ||
                             ',"qty":' || (i.item->>'qty') || '}', ',' ORDER BY i.n)
           FROM jsonb_array_elements(o.items) WITH ORDINALITY AS i(item, n)), '')
      || '],"status":"created","created_at":'
      || to_json(to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text
      || '}'
$$;
)sql"},
};

constexpr Migration kPaymentsMigrations[] = {
    {1, R"sql(
-- One charge per idempotency key (the relay derives it from the order: "<order_id>:charge").
CREATE TABLE demo_payments.charges (
  charge_id       uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id       text        NOT NULL,
  idempotency_key text        NOT NULL,
  order_id        uuid        NOT NULL,
  customer_id     text        NOT NULL,
  amount          bigint      NOT NULL CHECK (amount > 0),
  currency        text        NOT NULL,
  first_event_id  uuid        NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT charges_key_unique UNIQUE (tenant_id, idempotency_key)
);

-- The inbox: every delivery of an event is counted here, in the same statement as the
-- effect, so a redelivery is visible without ever causing a second effect.
CREATE TABLE demo_payments.processed_events (
  event_id           uuid        PRIMARY KEY,
  tenant_id          text        NOT NULL,
  idempotency_key    text        NOT NULL,
  deliveries         integer     NOT NULL DEFAULT 1,
  first_delivered_at timestamptz NOT NULL DEFAULT now(),
  last_delivered_at  timestamptz NOT NULL DEFAULT now()
);
)sql"},
};

constexpr Migration kInventoryMigrations[] = {
    {1, R"sql(
-- One reservation per idempotency key ("<order_id>:reserve").
CREATE TABLE demo_inventory.reservations (
  reservation_id  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id       text        NOT NULL,
  idempotency_key text        NOT NULL,
  order_id        uuid        NOT NULL,
  items           jsonb       NOT NULL CHECK (jsonb_typeof(items) = 'array'),
  first_event_id  uuid        NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT reservations_key_unique UNIQUE (tenant_id, idempotency_key)
);

CREATE TABLE demo_inventory.processed_events (
  event_id           uuid        PRIMARY KEY,
  tenant_id          text        NOT NULL,
  idempotency_key    text        NOT NULL,
  deliveries         integer     NOT NULL DEFAULT 1,
  first_delivered_at timestamptz NOT NULL DEFAULT now(),
  last_delivered_at  timestamptz NOT NULL DEFAULT now()
);
)sql"},
};

struct OwnerInfo {
  const char* schema;
  std::int64_t lock_key;  // pg_advisory_xact_lock key; distinct from idemproxy's
  const Migration* begin;
  const Migration* end;
};

OwnerInfo info(SchemaOwner owner) {
  switch (owner) {
    case SchemaOwner::orders:
      return {"demo_orders", 0x64656d6f0001, std::begin(kOrdersMigrations),
              std::end(kOrdersMigrations)};
    case SchemaOwner::payments:
      return {"demo_payments", 0x64656d6f0002, std::begin(kPaymentsMigrations),
              std::end(kPaymentsMigrations)};
    case SchemaOwner::inventory:
      return {"demo_inventory", 0x64656d6f0003, std::begin(kInventoryMigrations),
              std::end(kInventoryMigrations)};
  }
  throw std::logic_error("unknown schema owner");
}

struct ConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct ResultCloser {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ConnPtr = std::unique_ptr<PGconn, ConnCloser>;
using ResultPtr = std::unique_ptr<PGresult, ResultCloser>;

// Runs `sql` (text parameters only) and throws on anything but success. The message
// carries the server's text: this runs at start-up, where a person reads it.
ResultPtr run(PGconn* conn, const std::string& sql, const std::vector<std::string>& params = {}) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  // Without parameters PQexec allows several statements in one string (a migration).
  ResultPtr res(params.empty() ? PQexec(conn, sql.c_str())
                               : PQexecParams(conn, sql.c_str(), static_cast<int>(params.size()),
                                              nullptr, values.data(), nullptr, nullptr, 0));
  const auto status = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error(PQerrorMessage(conn));
  }
  return res;
}

}  // namespace

const char* schema_name(SchemaOwner owner) { return info(owner).schema; }

void ensure_schema(const std::string& conninfo, SchemaOwner owner) {
  const OwnerInfo owner_info = info(owner);
  const std::string schema = owner_info.schema;

  // expand_dbname: conninfo may be a URI or a key=value string. Its parameters count as if
  // written where "dbname" stands, and later entries win, so listing our defaults first
  // lets a connect_timeout or application_name in conninfo take precedence.
  const char* keys[] = {"connect_timeout", "application_name", "dbname", nullptr};
  const char* values[] = {"10", "idem_order_backend_setup", conninfo.c_str(), nullptr};
  ConnPtr conn(PQconnectdbParams(keys, values, /*expand_dbname=*/1));
  if (!conn || PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error("cannot connect to PostgreSQL: " +
                             std::string(conn ? PQerrorMessage(conn.get()) : "out of memory"));
  }

  try {
    run(conn.get(), "BEGIN");
    // Bounded waits: a stuck concurrent migrator fails this start instead of hanging it.
    run(conn.get(), "SET LOCAL lock_timeout = '15s'");
    run(conn.get(), "SET LOCAL statement_timeout = '60s'");
    // "already exists, skipping" notices are the normal case here, not news.
    run(conn.get(), "SET LOCAL client_min_messages = warning");
    run(conn.get(), "SELECT pg_advisory_xact_lock($1::bigint)",
        {std::to_string(owner_info.lock_key)});
    // Identifiers cannot be parameters; `schema` is one of our compile-time constants.
    run(conn.get(), "CREATE SCHEMA IF NOT EXISTS " + schema);
    run(conn.get(), "CREATE TABLE IF NOT EXISTS " + schema +
                        ".schema_migrations (version integer PRIMARY KEY, "
                        "applied_at timestamptz NOT NULL DEFAULT now())");
    auto current =
        run(conn.get(), "SELECT coalesce(max(version), 0) FROM " + schema + ".schema_migrations");
    const int applied = std::stoi(PQgetvalue(current.get(), 0, 0));
    for (const Migration* m = owner_info.begin; m != owner_info.end; ++m) {
      if (m->version <= applied) continue;
      run(conn.get(), m->sql);
      run(conn.get(), "INSERT INTO " + schema + ".schema_migrations (version) VALUES ($1::integer)",
          {std::to_string(m->version)});
    }
    run(conn.get(), "COMMIT");
  } catch (const std::exception& e) {
    throw std::runtime_error("setting up schema " + schema + " failed: " + e.what());
  }
}

}  // namespace idem::demo
