#pragma once
// Loading the configuration for a command, and what a reload may change.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gateway/router.hpp"
#include "server/tls.hpp"
#include "settings/settings.hpp"
#include "store/record_cipher.hpp"
#include "upstream/client.hpp"
#include "upstream/tls.hpp"

namespace idem::app {

// Loads and fully validates (including what only the gateway can compile, such as
// fingerprint pointers and defaults). Throws settings::ConfigError. `options.database`
// false: the database section is not read (settings::LoadOptions).
std::shared_ptr<const gateway::Runtime> load_runtime(const std::string& path,
                                                     settings::LoadOptions options = {});

// The TLS contexts a configuration names, built from its files now (server/tls.hpp,
// upstream/tls.hpp). Null where TLS is not configured.
struct TlsMaterial {
  std::shared_ptr<server::TlsContext> listener;
  std::shared_ptr<const upstream::ClientTls> upstream;
};
// Throws settings::ConfigError naming tls or upstream.tls when a file cannot be used.
TlsMaterial load_tls(const settings::Settings& s);

// The upstream pool's options from `upstream` (host, port, timeouts, body limit). For an
// https upstream, `tls` answers each new connection's TLS settings; it is ignored for
// plain HTTP. One place, so that the sidecar and verify-backend reach the backend alike.
upstream::PoolOptions upstream_pool_options(
    const settings::Settings& s, std::function<std::shared_ptr<const upstream::ClientTls>()> tls);

// The encryption keys a configuration names, read from their files now; null without
// `encryption`. Throws settings::ConfigError naming encryption.keys[i].file (never a
// file's content) when a file cannot be read or does not hold a key.
std::shared_ptr<const store::KeyRing> load_key_ring(const settings::Settings& s);

// The reload policy. Listener, upstream, database, workers and the admin listener are
// bound at start-up, and the replay cache needs the change listener that starts with the
// process: a reload keeps the running values for them rather than half-apply a change.
// So does the identity mode (tenant.from) and whether the listener speaks TLS at all.
// Whether answers are encrypted at all stays as started too (the stores are built with or
// without encryption). Everything else (routes, limits, logging, cleanup, the admin token,
// cache sizes, the TLS files of the listener and of an https upstream, the JWT settings
// and the JWKS file, the encryption keys and the active key) is taken from `next`; the
// files themselves are read again by the reload.
// Throws settings::ConfigError when the running encryption, kept, would meet a
// `completion: backend` route it does not allow (allow_clear_backend_records).
struct ReloadPlan {
  std::shared_ptr<settings::Settings> effective;  // what to run from now on
  std::vector<std::string> restart_only;          // changed keys kept until a restart
};
ReloadPlan plan_reload(const settings::Settings& next, const settings::Settings& running,
                       bool change_listener_running);

}  // namespace idem::app
