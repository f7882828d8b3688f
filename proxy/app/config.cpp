#include "app/config.hpp"

#include <fstream>
#include <map>

namespace idem::app {

std::shared_ptr<const gateway::Runtime> load_runtime(const std::string& path,
                                                     settings::LoadOptions options) {
  auto s = settings::load_file(path, options);
  // The pool is the database section's: unread, it has nothing to say about workers.
  if (options.database && s->workers > s->database.pool_size) {
    throw settings::ConfigError(path, 0, "database.pool_size",
                                "must be at least `workers` (" + std::to_string(s->workers) +
                                    "): every worker needs its own connection");
  }
  return gateway::Runtime::build(s);
}

namespace {

bool same_endpoint(const settings::Endpoint& a, const settings::Endpoint& b) {
  return a.host == b.host && a.port == b.port;
}

bool same_endpoint(const std::optional<settings::Endpoint>& a,
                   const std::optional<settings::Endpoint>& b) {
  return a.has_value() == b.has_value() && (!a || same_endpoint(*a, *b));
}

// upstream.tls is not compared: its files reload (plan_reload takes it from the next file).
bool same_upstream(const settings::UpstreamSettings& a, const settings::UpstreamSettings& b) {
  return a.url == b.url && a.connect_timeout == b.connect_timeout &&
         a.response_timeout == b.response_timeout && a.max_response_body == b.max_response_body;
}

bool same_database(const settings::DatabaseSettings& a, const settings::DatabaseSettings& b) {
  return a.url == b.url && a.pool_size == b.pool_size && a.connect_timeout == b.connect_timeout &&
         a.statement_timeout == b.statement_timeout;
}

// The listener's TLS: its files reload, but turning it on or off would change what every
// client must speak on a port it is already using. tenant.from changes who a request is
// from: it stays as started, with its own section, so a reload never drops verification.
void keep_identity(ReloadPlan& plan, const settings::Settings& next, const settings::Settings& running) {
  auto& e = *plan.effective;
  if (next.tls.has_value() != running.tls.has_value()) {
    plan.restart_only.emplace_back("tls");
    e.tls = running.tls;
  }
  if (next.tenant.from != running.tenant.from) {
    plan.restart_only.emplace_back("tenant.from");
    e.tenant.from = running.tenant.from;
    e.tenant.jwt = running.tenant.jwt;
    e.tenant.mtls = running.tenant.mtls;
  }
  // Identity from client certificates needs the listener to ask for them.
  if (e.tenant.from == settings::TenantSource::mtls && (!e.tls || e.tls->client_ca_file.empty())) {
    plan.restart_only.emplace_back("tls.client_ca_file");
    e.tls = running.tls;
  }
}

// The key ring reloads (its files are read again, `active` may change: rotation without a
// restart), but whether records are sealed at all is fixed at start: the stores are built
// with or without encryption. Kept encryption must still not meet a route whose backend
// writes clear records unless the running section allows them: such a reload is refused
// (load_text refuses the same combination in one file).
void keep_encryption(ReloadPlan& plan, const settings::Settings& next, const settings::Settings& running) {
  auto& e = *plan.effective;
  if (next.encryption.keys.empty() == running.encryption.keys.empty()) return;
  plan.restart_only.emplace_back("encryption");
  e.encryption = running.encryption;
  if (e.encryption.keys.empty() || e.encryption.allow_clear_backend_records) return;
  for (std::size_t i = 0; i < e.routes.size(); ++i) {
    if (e.routes[i].completion != settings::Completion::backend) continue;
    throw settings::ConfigError(next.source_file, 0, "routes[" + std::to_string(i) + "].completion",
                                "completion: backend stores clear records, and encryption (which a "
                                "reload cannot turn off) has no allow_clear_backend_records: true");
  }
}

}  // namespace

TlsMaterial load_tls(const settings::Settings& s) {
  TlsMaterial m;
  if (s.tls) {
    try {
      m.listener = server::make_server_context(*s.tls);
    } catch (const server::TlsError& e) {
      throw settings::ConfigError(s.source_file, 0, "tls", e.what());
    }
  }
  if (s.upstream.https) {
    const auto& t = s.upstream.tls;
    try {
      m.upstream = upstream::make_client_tls(t.ca_file, t.server_name.empty() ? s.upstream.host : t.server_name,
                                             t.verify);
    } catch (const upstream::ClientTlsError& e) {
      throw settings::ConfigError(s.source_file, 0, "upstream.tls", e.what());
    }
  }
  return m;
}

upstream::PoolOptions upstream_pool_options(
    const settings::Settings& s, std::function<std::shared_ptr<const upstream::ClientTls>()> tls) {
  upstream::PoolOptions o;
  o.host = s.upstream.host;
  o.port = s.upstream.port;
  o.connect_timeout = s.upstream.connect_timeout;
  o.response_timeout = s.upstream.response_timeout;
  o.max_response_body = s.upstream.max_response_body;
  if (s.upstream.https) o.tls = std::move(tls);
  return o;
}

std::shared_ptr<const store::KeyRing> load_key_ring(const settings::Settings& s) {
  if (s.encryption.keys.empty()) return nullptr;
  std::map<std::string, store::EncryptionKey> keys;
  for (std::size_t i = 0; i < s.encryption.keys.size(); ++i) {
    const auto& k = s.encryption.keys[i];
    const std::string where = "encryption.keys[" + std::to_string(i) + "].file";
    std::ifstream in(k.file, std::ios::binary);
    std::string text;
    if (in) {
      // A key file is 64 hex digits or 44 base64 characters, and a newline: read a little more
      // than that, never a whole large file someone pointed here by mistake.
      text.resize(256);
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<std::size_t>(in.gcount()));
    }
    if (!in && !in.eof()) throw settings::ConfigError(s.source_file, 0, where, "cannot read " + k.file);
    try {
      keys.emplace(k.id, store::parse_key_file(text));
    } catch (const std::invalid_argument& e) {
      throw settings::ConfigError(s.source_file, 0, where, k.file + ": " + e.what());
    }
  }
  try {
    return std::make_shared<const store::KeyRing>(std::move(keys), s.encryption.active);
  } catch (const std::invalid_argument& e) {
    throw settings::ConfigError(s.source_file, 0, "encryption", e.what());
  }
}

ReloadPlan plan_reload(const settings::Settings& next, const settings::Settings& running,
                       bool change_listener_running) {
  ReloadPlan plan;
  plan.effective = std::make_shared<settings::Settings>(next);
  auto& e = *plan.effective;
  auto keep = [&](const char* key, auto& field, const auto& current, bool same) {
    if (!same) plan.restart_only.emplace_back(key);
    field = current;
  };
  keep("listen", e.listen, running.listen, same_endpoint(next.listen, running.listen));
  keep("upstream", e.upstream, running.upstream, same_upstream(next.upstream, running.upstream));
  keep("database", e.database, running.database, same_database(next.database, running.database));
  keep("workers", e.workers, running.workers, next.workers == running.workers);
  // The admin listener is bound once too; its token, read per request, does reload.
  keep("admin.listen", e.admin.listen, running.admin.listen,
       same_endpoint(next.admin.listen, running.admin.listen));
  // An https upstream whose url stays: its TLS settings and files reload.
  if (e.upstream.https && next.upstream.https) e.upstream.tls = next.upstream.tls;
  keep_identity(plan, next, running);
  keep_encryption(plan, next, running);
  // The exporter and its thread start with the process; the sample rate reloads.
  if (next.tracing.otlp_endpoint != running.tracing.otlp_endpoint) {
    const double sample = e.tracing.sample;
    keep("tracing.otlp_endpoint", e.tracing, running.tracing, false);
    e.tracing.sample = sample;
  }
  // The cache can only serve with the change listener, which starts with the process.
  if (!change_listener_running) {
    keep("replay_cache.enabled", e.replay_cache.enabled, running.replay_cache.enabled,
         next.replay_cache.enabled == running.replay_cache.enabled);
  }
  return plan;
}

}  // namespace idem::app
