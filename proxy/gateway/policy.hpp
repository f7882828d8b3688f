#pragma once
// The idempotency policy document clients read at `policy_path` (docs/http.md, "Discovering
// the policy"): per protected route, what a client must send and what it will be told.
// Pure: built from the settings alone, once per configuration snapshot.
#include <string>

#include "settings/settings.hpp"

namespace idem::gateway {

// application/json. Names what the routes ask of clients and promise them — never the
// upstream, the database, the fingerprint's fields or anything of another tenant.
std::string policy_document(const settings::Settings& s);

}  // namespace idem::gateway
