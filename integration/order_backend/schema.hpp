#pragma once
// Each demo service owns one PostgreSQL schema and creates it itself at start-up, apart
// from idemproxy's table (which `idemproxy migrate` owns):
//
//   demo_orders     orders, outbox, coupons       (the order API; the relay reads the outbox)
//   demo_payments   charges, processed_events     (the fake payment service)
//   demo_inventory  reservations, processed_events (the fake inventory service)
//
// In production these would be three databases; one server with three schemas keeps the
// demo to a single throwaway PostgreSQL while no service reads another's tables.
#include <string>

namespace idem::demo {

enum class SchemaOwner { orders, payments, inventory };

const char* schema_name(SchemaOwner owner);

// Applies the owner's pending migrations in one transaction, serialized with concurrent
// starters (the API and the relay start together) by an advisory lock. Idempotent; costs
// one round trip when the schema is current. Blocking libpq: call it before the event
// loop runs. Throws std::runtime_error naming the server's message.
void ensure_schema(const std::string& conninfo, SchemaOwner owner);

}  // namespace idem::demo
