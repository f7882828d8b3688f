#include "app/explain.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "app/commands.hpp"
#include "app/config.hpp"
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "common/text.hpp"
#include "common/time_text.hpp"
#include "idempotency/decision.hpp"
#include "pg/pool.hpp"
#include "store/pg_store.hpp"
#include "server/request_head.hpp"

namespace idem::app {
namespace {

using gateway::Examination;

// Bytes a terminal must not interpret (a raw body may hold any) shown as \xNN, a newline
// as \n: the text stays one line and means exactly the bytes hashed.
std::string escaped(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// The canonical form one item a line, as <length>:<bytes> (idempotency/fingerprint.cpp).
// An item may itself hold items (the headers block); those stay inside its line.
std::string canonical_lines(std::string_view form, std::string_view indent) {
  std::string out;
  while (!form.empty()) {
    const auto colon = form.find(':');
    std::size_t len = 0;
    const bool digits = colon != std::string_view::npos && colon > 0 && colon < 10 &&
                        std::all_of(form.begin(), form.begin() + static_cast<std::ptrdiff_t>(colon),
                                    [](char c) { return c >= '0' && c <= '9'; });
    if (digits) len = std::stoul(std::string(form.substr(0, colon)));
    if (!digits || form.size() < colon + 2 + len || form[colon + 1 + len] != '\n') {
      // Not the layout this expects: the rest as it is, rather than a misreading.
      return out + std::string(indent) + escaped(form) + '\n';
    }
    out += std::string(indent) + std::string(form.substr(0, colon + 1)) + escaped(form.substr(colon + 1, len)) + '\n';
    form.remove_prefix(colon + 2 + len);
  }
  return out;
}

// A duration as the configuration writes it, in its largest whole unit.
std::string duration_text(Millis d) {
  const auto ms = d.count();
  if (ms % 1000 != 0 || ms == 0) return std::to_string(ms) + "ms";
  const auto s = ms / 1000;
  if (s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

std::vector<std::string> segments_of(std::string_view path) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= path.size()) {
    const auto slash = path.find('/', at);
    const auto end = slash == std::string_view::npos ? path.size() : slash;
    out.emplace_back(path.substr(at, end - at));
    if (slash == std::string_view::npos) break;
    at = slash + 1;
  }
  return out;
}

bool is_template_segment(std::string_view s) {
  return s.size() >= 2 && s.front() == '{' && s.back() == '}';
}

// Edit distance over path segments, a "{name}" segment of the route equal to any one: how
// far a request's path is from a route's, in segments added, removed or changed.
std::size_t segment_distance(const std::vector<std::string>& a, const std::vector<std::string>& route) {
  std::vector<std::size_t> prev(route.size() + 1), cur(route.size() + 1);
  for (std::size_t j = 0; j <= route.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= route.size(); ++j) {
      const bool same = a[i - 1] == route[j - 1] || is_template_segment(route[j - 1]);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[route.size()];
}

// The route a request that matches none was most likely meant for, and what differs.
std::string nearest_route(const settings::Settings& s, std::string_view method, std::string_view path) {
  const settings::RouteSettings* best = nullptr;
  std::size_t best_score = 0;
  const auto request = segments_of(path);
  for (const auto& r : s.routes) {
    const std::size_t score = segment_distance(request, segments_of(r.path)) * 2 + (r.method == method ? 0 : 1);
    if (!best || score < best_score) {
      best = &r;
      best_score = score;
    }
  }
  if (!best) return "no routes are configured";
  std::string why;
  const bool path_matches = segment_distance(request, segments_of(best->path)) == 0;
  if (!path_matches) why = "the path differs (the route's is " + best->path + ")";
  if (best->method != method) {
    if (!why.empty()) why += " and ";
    why += "the method differs (the route's is " + best->method + ")";
  }
  if (path_matches && best->method == method) {
    // Segment-equal but not matched: a difference match() sees and this does not (bytes
    // such as a percent-encoding in a template segment).
    why = "the path is not byte-equal to the route's " + best->path;
  }
  return best->name + " (" + best->method + " " + best->path + "): " + why;
}

std::string key_place(const settings::KeySettings& k) {
  switch (k.from) {
    case settings::KeySource::header: return "header " + k.header;
    case settings::KeySource::body: return "body member " + k.pointer;
    case settings::KeySource::query: return "query parameter " + k.param;
  }
  return {};
}

std::string_view format_name(settings::BodyFormat f) {
  switch (f) {
    case settings::BodyFormat::json: return "json";
    case settings::BodyFormat::form: return "form";
    case settings::BodyFormat::raw: return "raw";
  }
  return {};
}

void describe_route(std::ostream& o, const settings::RouteSettings& rs) {
  o << "route:        " << rs.name << " (" << rs.method << ' ' << rs.path << ")\n";
  o << "scope:        " << rs.scope << '\n';
  o << "key:          from " << key_place(rs.key) << (rs.key.required ? ", required" : ", optional")
    << ", at most " << rs.key.max_length << " characters\n";
}

void describe_answer(std::ostream& o, const server::Response& res, std::string_view code) {
  o << "answer:       " << res.result_int();
  if (!code.empty()) o << ' ' << code;
  if (const auto ct = res[http::field::content_type]; ct == "application/problem+json") {
    o << " (refused before anything is claimed or forwarded)\n";
  } else {
    o << " (answered by idemproxy; nothing is forwarded)\n";
  }
  o << "  " << escaped(res.body()) << '\n';
}

// What a new key gets: the claim, then the forward (contract §4, docs/http.md).
void describe_new_key(std::ostream& o, const Examination& e) {
  const auto& rs = *e.route->settings;
  o << "a new key:    claimed in PostgreSQL (in_progress, attempt 1, lease "
    << duration_text(rs.lease) << ") before anything is forwarded;\n"
    << "              then forwarded with X-Idempotency-Operation-Id and X-Idempotency-Attempt: 1;\n"
    << "              an answer whose status `store` keeps is recorded for " << duration_text(rs.retention)
    << " and replayed\n              to retries, any other answer releases the key";
  if (rs.async) o << ";\n              still running after " << duration_text(rs.async->after)
                  << ": 202 Accepted with its status resource";
  if (rs.completion == settings::Completion::backend) o << ";\n              the backend completes the record (completion: backend)";
  o << '\n';
}

void describe_admitted(std::ostream& o, const Examination& e) {
  const auto& rs = *e.route->settings;
  o << "key as read:  " << e.key << '\n';
  o << "fingerprint:  version \"" << rs.fingerprint.version << "\", format " << format_name(rs.fingerprint.format)
    << (rs.fingerprint.fields ? ", selected fields" : ", whole body") << '\n';
  o << "  canonical text hashed, one length-prefixed item a line (\\n is a newline byte):\n"
    << canonical_lines(e.canonical, "  | ");
  o << "  sha256:     " << e.fingerprint << '\n';
  o << "record:       tenant " << e.id.tenant << ", endpoint \"" << e.id.endpoint << "\", key " << e.id.key << '\n';
  o << "operation id: " << e.operation_id << '\n';
  describe_new_key(o, e);
}

void describe_identity(std::ostream& o, const settings::Settings& s, const Examination& e) {
  if (e.tenant.empty()) return;
  const bool verified = s.tenant.from != settings::TenantSource::header;
  o << "tenant:       " << e.tenant << (verified ? " (verified identity)" : " (header " + s.tenant.header + ")") << '\n';
  if (!s.tenant.principal_header.empty()) {
    o << "principal:    stored as hash " << e.principal.substr(0, 12) << "… of header " << s.tenant.principal_header
      << " (replays only to the same principal)\n";
  }
}

}  // namespace

bool is_explain_option(std::string_view arg) {
  return arg == "--tenant" || arg == "--header" || arg == "--body";
}

bool parse_explain_option(std::string_view arg, const std::string& value, ExplainOptions& o,
                          std::string& error) {
  if (arg == "--tenant") {
    o.tenant = value;
  } else if (arg == "--body") {
    std::ifstream in(value, std::ios::binary);
    if (!in) {
      error = "cannot read the --body file '" + value + "'";
      return false;
    }
    o.body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    o.body_given = true;
  } else if (arg == "--header") {
    const auto colon = value.find(':');
    if (colon == std::string::npos || colon == 0) {
      error = "--header takes 'Name: value'";
      return false;
    }
    o.headers.emplace_back(value.substr(0, colon), std::string(text::trim_ows(value.substr(colon + 1))));
  } else {
    error = "unknown option " + std::string(arg);
    return false;
  }
  return true;
}

server::Request explain_request(const gateway::Runtime& runtime, const ExplainOptions& o, std::string& problem) {
  server::Request req;
  req.version(11);
  req.method_string(o.method);
  req.target(o.target);
  for (const auto& [name, value] : o.headers) req.insert(name, value);
  if (!o.tenant.empty()) req.set(runtime.settings().tenant.header, o.tenant);
  if (req.find(http::field::host) == req.end()) req.set(http::field::host, "localhost");
  req.body() = o.body;
  if (o.body_given || !o.body.empty()) req.prepare_payload();
  const auto head = server::prepare_request_head(req.base());
  if (!head.ok) problem = std::string(head.problem);
  return req;
}

std::string explain_text(std::shared_ptr<const gateway::Runtime> runtime, const ExplainOptions& o,
                         gateway::Examination* out) {
  std::ostringstream text;
  const auto& s = runtime->settings();
  std::string problem;
  auto req = explain_request(*runtime, o, problem);
  text << "request:      " << o.method << ' ' << req.target() << " (" << o.body.size() << " body bytes)\n";
  if (!problem.empty()) {
    text << "answer:       400 bad_request from the listener: " << problem << '\n';
    return text.str();
  }
  server::RequestContext context;
  context.received_at = SteadyClock::now();
  auto e = gateway::examine(runtime, req, context);
  if (e.route) {
    describe_route(text, *e.route->settings);
  } else {
    text << "route:        none matches " << o.method << ' ' << req.target() << '\n';
    text << "nearest:      " << nearest_route(s, o.method, std::string(req.target().substr(0, req.target().find('?'))))
         << '\n';
  }
  describe_identity(text, s, e);
  switch (e.way) {
    case Examination::Way::answered:
      describe_answer(text, *e.answer, e.code);
      break;
    case Examination::Way::operation_status:
      text << "answer:       the state of an operation of an async route's status_path, read from the store\n";
      break;
    case Examination::Way::pass_through:
      text << "answer:       forwarded unchanged and unprotected (unmatched: pass): no key is claimed\n";
      break;
    case Examination::Way::pass_through_no_key:
      text << "answer:       no key and key.required is false: forwarded unprotected, nothing claimed\n";
      break;
    case Examination::Way::protected_request:
      describe_admitted(text, e);
      break;
  }
  if (out) *out = std::move(e);
  return text.str();
}

result<std::optional<store::Record>> read_record(const settings::Settings& cfg, const store::RecordId& id) {
  asio::io_context ioc{1};
  auto options = store::pg_store_pool_options(cfg.database.url, 1, cfg.database.connect_timeout,
                                              cfg.database.statement_timeout);
  // Read-only by PostgreSQL's own rule, not only by this code's choice of statement.
  options.settings.push_back({"default_transaction_read_only", "on"});
  options.application_name = "idemproxy-explain";
  auto pool = pg::Pool::create(ioc.get_executor(), std::move(options));
  store::PgStore pg_store(pool, store::PgStore::ClaimRead::never);
  auto done = asio::co_spawn(
      ioc, [&]() -> asio::awaitable<result<std::optional<store::Record>>> { co_return co_await pg_store.read(id); },
      asio::use_future);
  ioc.run();
  return done.get();
}

namespace {

std::string short_hash(std::string_view hex) { return std::string(hex.substr(0, 12)) + "…"; }

void describe_row(std::ostream& o, const store::Record& r) {
  o << "record now:   " << (r.state == store::State::completed ? "completed" : "in_progress") << ", attempt "
    << r.attempt << ", fingerprint " << short_hash(r.fingerprint) << ", created "
    << rfc3339_from_us(r.created_at_us);
  if (r.completed_at_us != 0) o << ", completed " << rfc3339_from_us(r.completed_at_us);
  o << ", recognised until " << rfc3339_from_us(r.expires_at_us) << (r.expired ? " (passed)" : "") << '\n';
}

}  // namespace

std::string record_text(const Examination& e, const std::optional<store::Record>& row) {
  std::ostringstream o;
  const auto& rs = *e.route->settings;
  idempotency::Situation now;
  if (row) {
    describe_row(o, *row);
    now.row = idempotency::RowView{row->fingerprint, row->principal, row->state == store::State::completed,
                                   row->attempt, row->lease_expired, row->expired, row->fence,
                                   row->lease_remaining};
  }
  now.fingerprint = e.fingerprint;
  now.principal = e.principal;
  now.check_principal = !e.principal.empty();
  now.wait_budget_left = true;  // a retry arriving now has its whole `wait` ahead
  o << "a retry now:  ";
  switch (idempotency::decide(now)) {
    case idempotency::Decision::claim_again:
      o << "no record: the key is new (above)\n";
      break;
    case idempotency::Decision::replace_expired:
      o << "the record's retention passed (not yet deleted): it is replaced, a new operation\n";
      break;
    case idempotency::Decision::reject_mismatch:
      o << rs.mismatch_status << " idempotency_key_reused: the key was recorded for another request (recorded "
        << "fingerprint " << short_hash(row->fingerprint) << ", this request's " << short_hash(e.fingerprint)
        << "); nothing is forwarded\n";
      break;
    case idempotency::Decision::forbid:
      o << "403 idempotency_key_forbidden: the record belongs to another principal\n";
      break;
    case idempotency::Decision::replay:
      o << "the recorded " << (row->response ? row->response->status : 0)
        << " replayed with Idempotent-Replayed: true; the backend is not called\n";
      break;
    case idempotency::Decision::take_over:
      o << "in progress, but its lease expired: taken over as attempt " << row->attempt + 1
        << " (same operation id) and forwarded again\n";
      break;
    case idempotency::Decision::wait:
    case idempotency::Decision::answer_in_progress:
      o << "in progress (lease renewed about " << duration_text(std::max(Millis{0}, rs.lease - row->lease_remaining))
        << " ago, " << duration_text(row->lease_remaining) << " left): waits up to " << duration_text(rs.wait)
        << " for it, then replays or answers 409 idempotency_in_progress\n";
      break;
  }
  return o.str();
}

int explain(ExplainOptions options) {
  // Without --database nothing connects: the database section is not read, so a
  // ${DATABASE_URL} it names need not be set where the request is explained.
  auto runtime = load_runtime(options.config_path, settings::LoadOptions{.database = options.database});
  if (!options.body_given && !isatty(STDIN_FILENO)) {
    options.body.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    options.body_given = !options.body.empty();
  }
  Examination e;
  std::cout << explain_text(runtime, options, &e);
  // Only an admitted request names a record; its id is tenant-scoped like every read.
  if (!options.database || e.way != Examination::Way::protected_request) return kExitOk;
  auto row = read_record(runtime->settings(), e.id);
  if (!row) {
    std::cout << std::flush;
    std::cerr << "idemproxy: explain: cannot read the record: " << row.error().message() << "\n";
    return kExitFailure;
  }
  std::cout << record_text(e, *row);
  return kExitOk;
}

}  // namespace idem::app
