#pragma once
// The validated configuration. settings/ is the only yaml-cpp user: every other
// component receives these plain structs, shared as shared_ptr<const Settings> so a
// reload swaps one pointer. Defaults here are the documented defaults (docs/configuration.md).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/types.hpp"

namespace idem::settings {

// "host:port"; host may be an IPv4/IPv6 literal ("[::1]:8080") or a name.
struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
};

// TLS towards the backend (an https:// upstream url). Files are read at start and on every
// reload (server/tls.hpp); only their paths live here.
struct UpstreamTls {
  std::string ca_file;      // PEM bundle of trusted CAs; "" = the system's trust store
  std::string server_name;  // the name sent (SNI) and verified; "" = the url's host
  bool verify = true;       // false only when written explicitly (warned at start)
};

struct UpstreamSettings {
  std::string url;            // as written (http[s]://host:port[/base])
  bool https = false;         // the url's scheme is https
  std::string host;           // parsed from url
  std::uint16_t port = 80;    // parsed from url (default 80, or 443 for https)
  std::string base_path;      // path prefix from url, "" when none ("/" is stored as "")
  Millis connect_timeout{2000};
  Millis response_timeout{30000};   // whole upstream exchange
  std::size_t max_response_body = 8u << 20;
  UpstreamTls tls;            // used when https
};

// The client-facing listener's TLS (top-level `tls`). Absent: plain HTTP.
struct ListenerTls {
  std::string cert_file;       // PEM: the certificate, then its chain
  std::string key_file;        // PEM, unencrypted
  std::string client_ca_file;  // "" = no client certificates; else every client needs one
};

enum class MigrateMode { check, automatic, off };  // YAML: check | auto | off

struct DatabaseSettings {
  std::string url;           // libpq URI or conninfo (secret: masked when printed)
  int pool_size = 8;         // per process, split across workers
  Millis connect_timeout{5000};
  Millis statement_timeout{2000};
  MigrateMode migrate = MigrateMode::check;
  // At start of `serve`, how long to keep trying to reach the database for `migrate`
  // (check or auto) before exiting: a replica started while PostgreSQL restarts or fails
  // over waits for it instead of exiting into its orchestrator's restart back-off.
  Millis start_wait{30000};
  // Group commit: concurrent claims (and completions) on a worker share one statement
  // and one commit, at most batch_max per batch (store/pg_store.hpp).
  bool batching = true;
  int batch_max = 32;
};

// Where the tenant (and principal) of a request come from (docs/security.md):
//   header: the tenant header as sent (a trusted layer in front sets it);
//   jwt:    a verified bearer token's claims;
//   mtls:   the verified client certificate's URI SAN.
// In jwt and mtls modes a client-sent tenant or principal header is refused, and the
// gateway sets both towards the backend from the verified identity.
enum class TenantSource { header, jwt, mtls };

struct JwtSettings {
  std::string jwks_file;             // a JWKS (RFC 7517) file, read at start and on reload
  std::vector<std::string> issuers;  // accepted `iss` values (exact)
  std::vector<std::string> audiences;  // accepted `aud` values (exact; one must match)
  std::string tenant_claim;          // the claim whose string value is the tenant
  std::string principal_claim = "sub";  // used when tenant.principal_header is set
  Millis leeway{30000};              // clock skew allowed on exp and nbf
};

struct MtlsSettings {
  // The tenant is the first path segment after this prefix in the certificate's URI SAN;
  // the whole URI is the principal (e.g. spiffe://orders.example/tenant/ and
  // spiffe://orders.example/tenant/acme/client/web -> tenant "acme").
  std::string uri_prefix;
};

struct TenantSettings {
  std::string header = "X-Tenant-Id";
  std::string principal_header;  // empty = principals are not checked
  TenantSource from = TenantSource::header;
  JwtSettings jwt;    // when from == jwt
  MtlsSettings mtls;  // when from == mtls
};

struct Limits {
  std::size_t max_header_bytes = 16u << 10;
  std::size_t max_request_body = 1u << 20;
  Millis header_timeout{10000};
  Millis body_timeout{30000};
  Millis idle_timeout{75000};
  std::size_t max_connections = 10000;
  // After SIGTERM: how long requests already in flight may take to finish before the
  // process exits anyway. Read when the signal arrives, so a reload applies to it.
  Millis drain_timeout{30000};
};

struct AdminSettings {
  std::optional<Endpoint> listen = Endpoint{"127.0.0.1", 9901};  // "" disables
  std::string token;  // secret; empty = admin paths only from loopback
};

enum class LogLevel { trace, debug, info, warn, error };
enum class LogFormat { json, text };

struct LogSettings {
  LogLevel level = LogLevel::info;
  LogFormat format = LogFormat::json;
};

struct CleanupSettings {
  Millis interval{60000};
  std::size_t batch = 1000;
};

// Not in the contract's example: documented extension (docs/configuration.md).
struct ReplayCacheSettings {
  bool enabled = true;
  std::size_t max_bytes = 32u << 20;  // per process
  Millis ttl{10000};
};

// `tracing`: W3C Trace Context is always continued (traceparent/tracestate forwarded, the
// trace id logged and recorded); spans are exported only with an endpoint.
struct TracingSettings {
  std::string otlp_endpoint;  // as written; "" = no export
  std::string host;           // parsed from otlp_endpoint
  std::uint16_t port = 80;
  std::string path;           // "/v1/traces" when the URL has no path
  double sample = 1.0;        // share of new traces (no client traceparent) sampled
};

// `encryption`: stored answers sealed with AES-256-GCM (store/record_cipher.hpp). The key
// files are read at start, by check-config and on reload; no keys = no encryption.
struct EncryptionKeyFile {
  std::string id;
  std::string file;
};
struct EncryptionSettings {
  std::vector<EncryptionKeyFile> keys;
  std::string active;  // the id new records are sealed with; required with keys
  // A `completion: backend` route's records are written by the backend, which has no key:
  // they stay in clear. Refused with encryption unless this says the operator accepts it.
  bool allow_clear_backend_records = false;
};

enum class Unmatched { pass, reject };

// Where a request carries its idempotency key (docs/configuration.md, §4.3): the key header
// (the IETF draft's way), a member of the body (Square's "idempotency_key"), or a query
// parameter (AWS's ClientToken).
enum class KeySource { header, body, query };

struct KeySettings {
  KeySource from = KeySource::header;
  // from: header, the field that carries the key; from: body or query, the field a client
  // must not also (or instead) send a key in.
  std::string header = "Idempotency-Key";
  std::string pointer;  // from: body: the member's JSON Pointer (or a form field path)
  std::string param;    // from: query: the parameter's name, as it reads decoded
  bool required = true;
  std::size_t max_length = 255;
};

// How a route's body is read (docs/configuration.md, §4.4): strict JSON; an
// application/x-www-form-urlencoded form, nested with brackets as Stripe and Rack read it,
// into the same model; or raw bytes, hashed with their media type.
enum class BodyFormat { json, form, raw };
// A form's repeated plain name ("a=1&a=2"): refused (backends disagree: first wins, last
// wins, a list), or read as a list.
enum class RepeatedNames { reject, list };

struct FingerprintSettings {
  BodyFormat format = BodyFormat::json;
  std::vector<std::string> media_types;  // raw: "type/subtype" accepted, lower case; [] = any
  RepeatedNames repeated_names = RepeatedNames::reject;  // form
  std::string version = "1";
  // JSON Pointers (RFC 6901), '*' segment = every array element. nullopt = whole body.
  std::optional<std::vector<std::string>> fields;
  std::vector<std::string> ignore;
  // pointer -> default value as canonical JSON text (e.g. "\"EUR\"", "0", "null").
  std::map<std::string, std::string> defaults;
  std::vector<std::string> headers;  // request header names, as written
  bool query = false;
};

// One entry of store.statuses: either a class ("2xx") or an exact code.
struct StatusPattern {
  int low = 0;   // inclusive
  int high = 0;  // inclusive
};

struct StoreSettings {
  std::vector<StatusPattern> statuses{{200, 299}, {400, 499}};
  std::vector<int> except{408, 425, 429};
  bool stores(int status) const;  // in statuses and not in except
};

// Who writes a completed record: the sidecar after the backend answered (default), or the
// backend itself, inside the transaction of its own writes (docs/backend.md).
enum class Completion { sidecar, backend };

// A slow operation answers 202 Accepted once the upstream has not answered within
// `after`, with the status resource `status_path` (a template with one {operation_id}
// segment, served on the main listener) in Location; the exchange goes on behind it.
struct AsyncSettings {
  Millis after{0};
  std::string status_path;
};

// How a replay answers: the stored bytes, or the stored status with the resource's current
// representation fetched from the backend with the retrying client's own credentials.
enum class ReplayMode { stored, refetch };

// What a takeover does when the earlier attempt's outcome is unknown (a timeout, a crash
// mid-call): forward again (`retake`), or first ask the backend whether the operation
// happened (`reconcile`: `method` `path`, a template with one {operation_id} segment).
enum class UnknownOutcome { retake, reconcile };
struct ReconcileSettings {
  std::string method = "GET";
  std::string path;
};
// A client that makes a new key for every retry defeats idempotency: each retry is a new
// operation. same_payload_new_key notices a new key whose request carries the fingerprint
// of a recent one of the same tenant, endpoint (and principal, where principals are
// checked): count it (metric and log), warn (also a header on the answer), or reject it
// (409 naming the earlier key's operation).
enum class SamePayloadAction { count, warn, reject };
struct SamePayloadSettings {
  Millis window{10 * 60 * 1000};
  SamePayloadAction action = SamePayloadAction::count;
};

struct RouteSettings {
  std::string name;
  std::string method;   // upper-case token
  std::string path;     // exact or template with {name} segments
  std::string scope;    // default "METHOD path"
  KeySettings key;
  FingerprintSettings fingerprint;
  Millis retention{24LL * 3600 * 1000};
  Millis lease{30000};
  Millis wait{5000};
  Millis retry_after{1000};
  int mismatch_status = 409;  // 409 or 422
  StoreSettings store;
  std::vector<std::string> replay_headers{"Content-Type", "Location", "ETag"};
  std::size_t max_stored_body = 1u << 20;
  Completion completion = Completion::sidecar;
  std::optional<AsyncSettings> async;  // absent: answers wait for the upstream
  ReplayMode replay_mode = ReplayMode::stored;
  // replay.hosts (refetch only): authorities ("host" or "host:port", lower case) besides the
  // retrying request's own Host whose absolute Location a replay re-fetches. Any other
  // absolute Location is replayed from its stored bytes.
  std::vector<std::string> refetch_hosts;
  UnknownOutcome on_unknown_outcome = UnknownOutcome::retake;
  ReconcileSettings reconcile;  // with on_unknown_outcome: reconcile
  std::optional<SamePayloadSettings> same_payload_new_key;  // absent: not looked for
  // Line of the route's fingerprint section (or of the route) in the file, so errors found
  // when the route is compiled still name a line. 0 when not loaded from a file.
  int source_line = 0;
};

struct Settings {
  std::string source_file;  // the file it was loaded from
  Endpoint listen{"127.0.0.1", 8080};
  std::optional<ListenerTls> tls;  // absent: the listener speaks plain HTTP
  // Event-loop threads; 0 = one per CPU. Not in the contract's example: documented extension.
  int workers = 0;
  UpstreamSettings upstream;
  DatabaseSettings database;
  TenantSettings tenant;
  Limits limits;
  AdminSettings admin;
  LogSettings log;
  CleanupSettings cleanup;
  ReplayCacheSettings replay_cache;
  TracingSettings tracing;
  EncryptionSettings encryption;
  Unmatched unmatched = Unmatched::pass;
  // Where clients read the routes' idempotency policy (GET, JSON); "" = not served.
  std::string policy_path = "/.well-known/idempotency";
  std::vector<RouteSettings> routes;
};

// Thrown only while loading: names the file, the line (1-based, 0 if unknown) and the key
// path (e.g. "routes[0].lease"). main() turns it into exit status 2.
// what() is the message alone; full_message() is "file:line: key: message" (the line and
// the key left out when unknown).
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string file, int line, std::string key, const std::string& message);
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  const std::string& key() const noexcept { return key_; }
  std::string full_message() const;

 private:
  std::string file_;
  int line_;
  std::string key_;
};

// What a command needs of the file. Without `database`, the section must be present but
// none of its values is expanded or checked and Settings::database keeps its defaults: for
// a command that never connects (explain without --database), so that a ${DATABASE_URL}
// the file names need not be set where the command runs.
struct LoadOptions {
  bool database = true;
};

// Reads, expands ${VAR} / ${VAR:-default}, validates. Throws ConfigError.
std::shared_ptr<const Settings> load_file(const std::string& path, LoadOptions options = {});
// Same, from text (tests); `name` stands in for the file name in errors.
std::shared_ptr<const Settings> load_text(const std::string& yaml, const std::string& name,
                                          LoadOptions options = {});

// The effective configuration as YAML, every key present, secrets masked
// (database password in URL/conninfo, admin.token). Key and certificate files are named
// by path; their contents are never read here.
std::string render_effective(const Settings& s);

// database.url with the password replaced by "****": the user:password part of a URI, its
// password= / sslpassword= parameters, and the same keys of a conninfo string. For logs and
// error messages that name the database.
std::string mask_database_url(std::string_view url);

// Parsing helpers, exposed for tests and for other components' flags.
std::optional<Millis> parse_duration(std::string_view text);     // "250ms" "5s" "2m" "24h" "7d"
std::optional<std::size_t> parse_size(std::string_view text);    // "1024" "64KiB" "1MiB" "1GiB"

}  // namespace idem::settings
