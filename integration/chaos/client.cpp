#include "client.hpp"

#include <algorithm>
#include <thread>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "support/http.hpp"

namespace idem::chaos {

namespace json = boost::json;

namespace {

std::string problem_code(const it::HttpResponse& res) {
  const auto type = res.header("Content-Type");
  if (!type || type->find("json") == std::string::npos) return {};
  boost::system::error_code ec;
  const json::value doc = json::parse(res.body, ec);
  if (ec || !doc.is_object()) return {};
  const auto* code = doc.get_object().if_contains("code");
  return code && code->is_string() ? std::string(code->get_string()) : std::string();
}

}  // namespace

Clients::Clients(const Plan& plan, History& history, std::vector<std::uint16_t> replica_ports,
                 ClientOptions options)
    : plan_(plan),
      history_(history),
      ports_(std::move(replica_ports)),
      options_(options),
      limit_(plan.entries.size()) {}

void Clients::run() {
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < options_.workers; ++i) threads.emplace_back([this] { worker(); });
}

std::size_t Clients::take() {
  std::lock_guard lock(take_mutex_);
  const std::size_t next = next_.load();
  if (aborted_.load() || next >= limit_) return plan_.entries.size();
  next_.store(next + 1);
  return next;
}

void Clients::drain() {
  std::lock_guard lock(take_mutex_);
  limit_ = next_.load();
}

void Clients::worker() {
  std::vector<it::HttpClient> clients;
  for (const auto port : ports_) clients.emplace_back(port);
  for (;;) {
    const std::size_t index = take();
    if (index >= plan_.entries.size()) return;
    run_entry(index, clients);
    settled_.fetch_add(1);
  }
}

// Every choice of an attempt (replica, form, backoff) comes from the entry's own stream of
// the seed: the same seed makes the same choices, whatever the timing did to the number
// of attempts of other entries.
void Clients::run_entry(std::size_t index, std::vector<it::HttpClient>& clients) {
  const Entry& entry = plan_.entries[index];
  const Operation& op = plan_.operations.at(entry.operation);
  Rng rng(Rng::derive(options_.seed, index));
  const it::Deadline give_up(options_.give_up);
  Millis backoff{5};
  int last_replica = -1;
  bool last_unanswered = false;
  for (int attempt = 1;; ++attempt) {
    Attempt a{.entry = index,
              .attempt = attempt,
              .operation = op.id,
              .tenant = op.tenant,
              .key = op.key,
              .body = entry.body};
    a.form = static_cast<std::uint32_t>(rng.next());
    // Like a client behind a load balancer with sticky connections: a retry mostly goes
    // where the last answer came from, and after no answer mostly to another replica, so
    // retries keep reaching a live replica while a silent one may still own the key.
    const auto other = [&](int from) {
      return static_cast<int>((static_cast<std::size_t>(from) + 1 + rng.below(ports_.size() - 1)) %
                              ports_.size());
    };
    a.replica = static_cast<int>(rng.below(ports_.size()));
    if (last_replica >= 0 && ports_.size() > 1) {
      if (last_unanswered && rng.chance(0.8)) {
        a.replica = other(last_replica);
      } else if (!last_unanswered && rng.chance(0.7)) {
        a.replica = last_replica;
      }
    }
    const std::string body = render_body(op.bodies.at(entry.body), a.form);
    const it::Headers headers{{"Content-Type", "application/json"},
                              {"X-Tenant-Id", op.tenant},
                              {"Idempotency-Key", render_key(op.key, a.form)}};
    auto& client = clients.at(a.replica);
    a.sent_us = run_clock_us();
    try {
      const auto res = client.post("/orders", body, headers, options_.request_timeout);
      a.received_us = run_clock_us();
      a.status = res.status;
      a.code = problem_code(res);
      a.replayed = res.header("Idempotent-Replayed") == "true";
      a.location = res.header("Location").value_or("");
      a.retry_after = res.header("Retry-After").value_or("");
      if (a.definite()) a.body_text = res.body;
      if (!res.keep_alive) client.close();
    } catch (const std::exception& e) {
      a.received_us = run_clock_us();
      a.error = e.what();
      client.close();  // whatever state the connection is in, it is not reused
    }
    requests_.fetch_add(1);
    last_replica = a.replica;
    last_unanswered = a.status == 0;
    const bool done = a.definite();
    if (done) last_definite_us_.store(a.received_us);
    history_.add(std::move(a));
    if (done || give_up.passed() || aborted_.load()) return;
    // A client that retries quickly, with jitter so duplicates do not move in lockstep.
    const auto jitter = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(backoff.count()) + 1));
    std::this_thread::sleep_for(Millis(backoff.count() / 2 + jitter));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace idem::chaos
