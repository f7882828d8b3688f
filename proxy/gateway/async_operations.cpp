// Long operations on routes with `async` (docs/http.md, "Long operations"): the client gets
// 202 Accepted with an operation status resource once the upstream has not answered within
// `after`, while the exchange goes on behind it, detached from the client's connection; and
// the status resource itself. Every decision about the record is still the protocol's
// (idempotency/protocol.hpp): this file only decides when the client stops waiting for it.
#include <algorithm>
#include <chrono>
#include <iterator>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "common/json_text.hpp"
#include "common/time_text.hpp"
#include "gateway/exchange.hpp"
#include "gateway/headers.hpp"
#include "idempotency/fingerprint.hpp"

namespace idem::gateway {
namespace {

using obs::Outcome;
using obs::StoreOp;

std::string status_location(const settings::AsyncSettings& async, std::string_view op_id) {
  std::string path = async.status_path;
  const auto at = path.find("{operation_id}");
  path.replace(at, std::string_view("{operation_id}").size(), op_id);
  return path;
}

// The id a status path names: the hex SHA-256 idempotency::operation_id() makes. Anything
// else is not an operation, and is answered like an unknown one.
bool well_formed_operation_id(std::string_view id) {
  if (id.size() != 64) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

server::Response json_answer(const Gateway::Exchange& x, http::status status, std::string body) {
  server::Response res{status, x.version};
  res.set(http::field::content_type, "application/json");
  // A status changes under the client: no cache may keep one.
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  res.keep_alive(x.keep_alive);
  res.prepare_payload();
  return res;
}

// {"status":…,"operation_id":…,"attempt":…,"age_seconds":…}
std::string status_body(std::string_view status, std::string_view op_id, std::int64_t attempt,
                        std::int64_t created_at_us) {
  std::string out = "{\"status\":";
  text::append_json_string(out, status);
  out += ",\"operation_id\":";
  text::append_json_string(out, op_id);
  out += ",\"attempt\":" + std::to_string(attempt);
  if (created_at_us > 0) {
    // The sidecar's clock against the database's: close enough for "how long so far".
    const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const auto age = std::max<std::int64_t>(0, (now_us - created_at_us) / 1000000);
    out += ",\"age_seconds\":" + std::to_string(age);
  }
  out += "}\n";
  return out;
}

// The values the client's exchange needs from the one the detached job ran (access log,
// metrics, the 202's attempt).
void take_results(Gateway::Exchange& client, Gateway::Exchange& job) {
  client.outcome = job.outcome;
  client.code = job.code;
  client.fenced = job.fenced;
  client.attempt = job.attempt;
  client.from_cache = job.from_cache;
  client.store_seconds = job.store_seconds;
  client.upstream_seconds = job.upstream_seconds;
  client.key_expires_at_us = job.key_expires_at_us;
  client.record_trace_id = job.record_trace_id;
  client.answer_from_record = job.answer_from_record;
  // The job's spans so far join the request's (those after a 202 are not exported).
  client.spans.insert(client.spans.end(), std::make_move_iterator(job.spans.begin()),
                      std::make_move_iterator(job.spans.end()));
  job.spans.clear();
}

}  // namespace

Gateway::AsyncJob::AsyncJob(server::Request&& req, const server::RequestContext& ctx,
                            std::shared_ptr<const Runtime> runtime, asio::any_io_executor ex)
    : request(std::move(req)),
      peer_address(ctx.peer_address),
      client_uris(ctx.client_uris.begin(), ctx.client_uris.end()),
      context(ctx),
      signal(std::move(ex), SteadyClock::time_point::max()) {
  // The listener's views live only as long as the client's request: point at our copies.
  context.peer_address = peer_address;
  context.client_uris = client_uris;
  x.emplace(request, context, std::move(runtime));
  x->async = this;
}

// The request's exchange moves into a job of its own (its request, context and state), so
// that it can outlive the client's wait. The client waits for the job's answer until the
// forward has run `after` without one, then answers 202; the job goes on to complete (or
// release) the record, with its lease kept alive, and counts as an owner for the drain.
asio::awaitable<server::Response> Gateway::run_async(Exchange& x) {
  auto job = std::make_shared<AsyncJob>(std::move(x.request), x.context, x.runtime,
                                        deps_.executor);
  job->x->continue_from(x);
  asio::co_spawn(
      deps_.executor,
      [this, job]() -> asio::awaitable<void> {
        try {
          job->answer = co_await run_protocol(*job->x);
        } catch (...) {
          job->failure = std::current_exception();
        }
        job->finished = true;
        job->signal.cancel();
        if (job->detached) note_background(*job->x);
      },
      asio::detached);
  // The job moves the timer's expiry to `after` past the start of its forward (which
  // wakes this wait, aborted), and cancels it when done. It may have finished before the
  // first wait: look before each.
  bool after_passed = false;
  while (!job->finished && !after_passed) {
    error_code ec;
    co_await job->signal.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    after_passed = !ec;
  }
  if (job->finished) {
    if (job->failure) std::rethrow_exception(job->failure);
    take_results(x, *job->x);
    co_return std::move(*job->answer);
  }
  job->detached = true;
  take_results(x, *job->x);
  co_return co_await accepted(x, job->x->owner.attempt, job->x->owner.expires_at_us);
}

void Gateway::AsyncJob::forwarding(Millis after) { signal.expires_after(after); }

// The end of an operation whose client was told 202: only the log and the metrics hear of
// it here; the client learns it from the status resource or a retry.
void Gateway::note_background(const Exchange& x) {
  deps_.metrics->async_operation(x.outcome);
  spdlog::info("long operation finished after 202 (route {}, key_hash {}, attempt {}): {}",
               x.route->settings->name, x.key_hash, x.attempt, obs::to_string(x.outcome));
}

// 202 Accepted with the status resource. Its entry is registered first, so the Location is
// readable by the time the client has it; without it the client gets the usual
// in-progress answer, and its retry of the request tells it more.
asio::awaitable<server::Response> Gateway::accepted(Exchange& x, std::int64_t attempt,
                                                    std::int64_t expires_at_us) {
  const auto& rs = *x.route->settings;
  if (x.operation_id.empty()) {
    x.operation_id = idempotency::operation_id(x.tenant, x.claim.id.endpoint, x.key);
  }
  auto registered = co_await timed(
      *deps_.metrics, x, StoreOp::register_operation, deps_.store->register_operation(x.claim.id, x.operation_id));
  if (!registered || !*registered) {
    spdlog::warn("could not register the status of a long operation (route {}, key_hash {}): {}",
                 rs.name, x.key_hash,
                 registered ? std::string("its record is gone") : registered.error().message());
    x.outcome = Outcome::in_progress;
    x.code = "idempotency_in_progress";
    auto res = problem(x, http::status::conflict, x.code, "Request in progress",
                       "a request with this key is still being processed; retry after the "
                       "indicated delay");
    res.set(http::field::retry_after, retry_after_seconds(rs.retry_after));
    co_return res;
  }
  x.outcome = Outcome::accepted;
  x.code = "accepted";
  x.attempt = attempt;
  const std::string location = status_location(*rs.async, x.operation_id);
  auto res = json_answer(x, http::status::accepted,
                         status_body("in_progress", x.operation_id, attempt, 0));
  res.set(http::field::location, location);
  res.set(http::field::retry_after, retry_after_seconds(rs.retry_after));
  if (expires_at_us > 0) {
    res.set(std::string(kKeyExpiresHeader), imf_fixdate_from_us(expires_at_us));
  }
  co_return res;
}

// GET <status_path>: the state of one operation of this tenant (and principal, when
// configured). Every way of not being this client's operation — unknown, another tenant's,
// another principal's, another route's, released — is the same 404, byte for byte.
asio::awaitable<server::Response> Gateway::operation_status(Exchange& x, const StatusMatch& m) {
  x.outcome = Outcome::rejected;
  x.route = m.routes.front();
  if (auto refused = admit_identity(x)) co_return std::move(*refused);
  const auto not_found = [&x] {
    x.outcome = Outcome::rejected;
    x.code = "operation_not_found";
    return problem(x, http::status::not_found, x.code, "Operation not found",
                   "no operation of yours has this id");
  };
  if (!well_formed_operation_id(m.operation_id)) co_return not_found();
  auto found = co_await timed(*deps_.metrics, x, StoreOp::find_operation,
                                         deps_.store->find_operation(x.tenant, m.operation_id));
  if (!found) co_return store_unavailable(x, x.store_error);
  if (!*found) co_return not_found();
  const store::OperationRecord& op = **found;
  const CompiledRoute* route = nullptr;
  for (const auto* r : m.routes) {
    if (r->settings->scope == op.id.endpoint) route = r;
  }
  if (route == nullptr || (x.check_principal && op.record.principal != x.principal)) {
    co_return not_found();
  }
  x.route = route;
  x.key_hash = idempotency::log_hash(x.tenant, op.id.key);
  x.attempt = op.record.attempt;
  const auto& rs = *route->settings;
  server::Response res;
  if (op.record.state == store::State::completed && op.record.response) {
    const auto& stored = *op.record.response;
    const auto location = std::find_if(stored.headers.begin(), stored.headers.end(),
                                       [](const auto& h) { return iequals(h.name, "Location"); });
    x.outcome = Outcome::replayed;
    if (stored.status >= 200 && stored.status < 300 && location != stored.headers.end()) {
      // The operation made a resource: that is where its result is.
      x.code = "operation_completed";
      res = json_answer(x, http::status::see_other,
                        status_body("completed", m.operation_id, op.record.attempt,
                                    op.record.created_at_us));
      res.set(http::field::location, location->value);
    } else {
      res = replay(stored, x);
    }
  } else {
    // Running, or its last attempt ended with its outcome unknown (a timeout, a crash):
    // then a retry of the request with the same key resumes it.
    x.outcome = Outcome::in_progress;
    x.code = op.record.lease_expired ? "operation_stalled" : "operation_in_progress";
    res = json_answer(x, http::status::ok,
                      status_body(op.record.lease_expired ? "stalled" : "in_progress",
                                  m.operation_id, op.record.attempt, op.record.created_at_us));
    res.set(http::field::retry_after, retry_after_seconds(rs.retry_after));
  }
  res.set(std::string(kKeyExpiresHeader), imf_fixdate_from_us(op.record.expires_at_us));
  co_return res;
}

}  // namespace idem::gateway
