#pragma once
// `idemproxy explain`: what the sidecar would do with one request, told step by step — the
// route that matches (or the nearest one and why it does not), the tenant and principal,
// the key as read (or the exact refusal), the bytes the fingerprint hashes and the hash,
// the record's id and operation id, and the answer a new key gets before forwarding. The
// account comes from gateway::examine(), the gateway's own admission path: nothing here
// decides anything about a request. Without --database it reads no database and sends
// nothing anywhere.
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "gateway/examine.hpp"
#include "store/record.hpp"

namespace idem::app {

struct ExplainOptions {
  std::string config_path;
  std::string tenant;  // --tenant: sent in tenant.header; "" = not sent
  std::vector<std::pair<std::string, std::string>> headers;  // --header 'Name: value'
  std::string method;
  std::string target;
  std::string body;
  bool body_given = false;  // --body FILE, or standard input when it is not a terminal
  bool database = false;    // --database: also read the record (read-only)
};

// The command line's explain options (--tenant, --header, --body FILE); false with
// `error` set when the value is unusable. --database takes no value (main handles it).
bool is_explain_option(std::string_view arg);
bool parse_explain_option(std::string_view arg, const std::string& value, ExplainOptions& options,
                          std::string& error);

// The request explain examines: the method, target, headers and body given, with a Host
// (when none was given) and Content-Length, after the listener's own checks
// (server::prepare_request_head). `problem` is set when the listener would refuse it.
server::Request explain_request(const gateway::Runtime& runtime, const ExplainOptions& options,
                                std::string& problem);

// The account of the request, without the database. `out`: what examine() found.
std::string explain_text(std::shared_ptr<const gateway::Runtime> runtime, const ExplainOptions& options,
                         gateway::Examination* out = nullptr);

// --database: the record `id` as a duplicate would read it (store::PgStore::read(), the
// same statement), on one connection whose session PostgreSQL holds read-only.
result<std::optional<store::Record>> read_record(const settings::Settings& cfg, const store::RecordId& id);

// What a retry of the examined request gets now, given the record read (nullopt: none),
// decided by idempotency::decide() as the sidecar decides it.
std::string record_text(const gateway::Examination& e, const std::optional<store::Record>& row);

// Loads the configuration, reads the body from standard input when none was given and
// stdin is not a terminal, prints the account (with --database, the record's too).
// Returns 0 when the request was explained, 1 when --database could not read the record.
int explain(ExplainOptions options);

}  // namespace idem::app
