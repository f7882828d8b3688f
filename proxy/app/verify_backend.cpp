#include "app/verify_backend.hpp"

#include <fstream>
#include <iostream>
#include <iterator>
#include <random>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "app/commands.hpp"
#include "app/config.hpp"
#include "gateway/headers.hpp"
#include "idempotency/backend_completion.hpp"
#include "idempotency/fingerprint.hpp"
#include "pg/pool.hpp"
#include "store/pg_store.hpp"
#include "upstream/client.hpp"

namespace idem::app {
namespace {

enum class Verdict { ok, fail, skip };

struct Check {
  std::string name;
  Verdict verdict;
  std::string detail;
};

std::string random_suffix() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) s.push_back(kHex[rng() & 0x0f]);
  return s;
}

std::string describe(const upstream::Outcome& out) {
  if (out.failure != upstream::Failure::none) return upstream::to_string(out.failure);
  return std::to_string(out.response.result_int()) + ", " +
         std::to_string(out.response.body().size()) + " bytes";
}

bool same_answer(const upstream::Outcome& a, const upstream::Outcome& b) {
  return a.failure == upstream::Failure::none && b.failure == upstream::Failure::none &&
         a.response.result_int() == b.response.result_int() && a.response.body() == b.response.body();
}

bool success(const upstream::Outcome& out) {
  return out.failure == upstream::Failure::none && out.response.result_int() / 100 == 2;
}

// One run: the store and upstream pool, and the request every check sends.
class Verifier {
 public:
  Verifier(asio::io_context& ioc, const VerifyOptions& options,
           std::shared_ptr<const gateway::Runtime> runtime, const settings::RouteSettings& route)
      : options_(options), runtime_(std::move(runtime)), route_(route) {
    const auto& cfg = runtime_->settings();
    pool_ = pg::Pool::create(
        ioc.get_executor(),
        store::pg_store_pool_options(cfg.database.url, 2, cfg.database.connect_timeout,
                                     cfg.database.statement_timeout));
    store_ = std::make_unique<store::PgStore>(pool_);
    // The backend is checked over the same TLS as the sidecar would use (upstream.tls);
    // load_tls builds no client context for a plain-HTTP upstream.
    upstream_ = std::make_unique<upstream::Pool>(
        ioc.get_executor(), upstream_pool_options(cfg, [tls = load_tls(cfg).upstream] { return tls; }));
  }

  asio::awaitable<std::vector<Check>> run() {
    std::vector<Check> checks;
    const bool backend = route_.completion == settings::Completion::backend;
    checks.push_back(co_await deduplication(backend));
    if (backend) {
      for (auto& c : co_await fencing()) checks.push_back(std::move(c));
    } else {
      checks.push_back({"stale attempt fenced by the database", Verdict::skip,
                        "the route completes in the sidecar (completion: sidecar); the backend's "
                        "own writes are fenced only with completion: backend"});
      checks.push_back({"completion in the backend's transaction", Verdict::skip,
                        "completion: sidecar"});
    }
    checks.push_back(co_await directive());
    for (const auto& id : claimed_) co_await store_->purge(id);
    upstream_->shutdown();
    pool_->close();
    co_return checks;
  }

 private:
  store::ClaimRequest claim_request(const std::string& key) const {
    return store::ClaimRequest{store::RecordId{options_.tenant, route_.scope, key}, "verify", "",
                               route_.lease, route_.retention};
  }

  // Claims a key of its own and returns the claim (nullopt if the store failed).
  asio::awaitable<std::optional<store::Ownership>> claim(const store::ClaimRequest& req) {
    claimed_.push_back(req.id);
    auto won = co_await store_->claim(req);
    if (!won || !won->won) co_return std::nullopt;
    co_return won->owner;
  }

  // Expires the claim's lease and takes it over: attempt + 1, a new fence.
  asio::awaitable<std::optional<store::Ownership>> take_over(const store::RecordId& id,
                                                             const store::Ownership& owner) {
    auto expired = co_await store_->expire_lease(id, owner.fence);
    if (!expired || !*expired) co_return std::nullopt;
    auto taken = co_await store_->take_over(id, owner.fence, route_.lease);
    if (!taken) co_return std::nullopt;
    co_return *taken;
  }

  // Sends the route's request as `owner` would (with its record reference, or none).
  asio::awaitable<upstream::Outcome> send(const std::string& key, const store::Ownership& owner,
                                          bool with_reference, const std::string& body) {
    const auto& cfg = runtime_->settings();
    upstream::Request req;
    req.method_string(route_.method);
    req.version(11);
    req.target(cfg.upstream.base_path + (options_.target.empty() ? route_.path : options_.target));
    req.set(http::field::host, cfg.upstream.host);
    req.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : options_.headers) req.set(name, value);
    req.set(cfg.tenant.header, options_.tenant);
    req.set(route_.key.header, key);
    gateway::set_owner_headers(
        req.base(), idempotency::operation_id(options_.tenant, route_.scope, key), owner,
        with_reference
            ? idempotency::record_reference(owner.fence, route_.retention, route_.scope, key)
            : std::string());
    req.body() = body;
    req.prepare_payload();
    co_return co_await upstream_->send(std::move(req));
  }

  // Attempt 1 reaches the backend but its answer is "lost" (no reference, nothing
  // completed); a takeover forwards attempt 2 of the same operation: the backend must
  // find what attempt 1 did and answer the same.
  asio::awaitable<Check> deduplication(bool backend) {
    Check c{"operation-id deduplication across attempts", Verdict::fail, ""};
    const std::string key = "verify-dedupe-" + random_suffix();
    const auto req = claim_request(key);
    const auto first = co_await claim(req);
    if (!first) co_return Check{c.name, Verdict::fail, "the store did not take the claim"};
    const auto a1 = co_await send(key, *first, false, options_.body);
    if (!success(a1)) {
      c.detail = "attempt 1 was not answered with a success (" + describe(a1) +
                 "); give a request the backend accepts with --body FILE";
      co_return c;
    }
    const auto second = co_await take_over(req.id, *first);
    if (!second) co_return Check{c.name, Verdict::fail, "the store did not allow the takeover"};
    const auto a2 = co_await send(key, *second, backend, options_.body);
    if (!same_answer(a1, a2)) {
      const bool same_status = a2.failure == upstream::Failure::none &&
                               a2.response.result_int() == a1.response.result_int();
      c.detail = "attempt 2 of the same operation got another answer (attempt 1: " + describe(a1) +
                 "; attempt 2: " + describe(a2) + (same_status ? ", another body" : "") +
                 "): the backend does not deduplicate on X-Idempotency-Operation-Id";
      co_return c;
    }
    co_return Check{c.name, Verdict::ok, "attempt 2 got attempt 1's answer (" + describe(a2) + ")"};
  }

  // A stale attempt (its claim taken over) must not be able to complete the record or
  // commit its writes; the owner's answer is recorded by the backend itself.
  asio::awaitable<std::vector<Check>> fencing() {
    std::vector<Check> out;
    const std::string key = "verify-fence-" + random_suffix();
    const auto req = claim_request(key);
    const auto stale = co_await claim(req);
    const auto owner = stale ? co_await take_over(req.id, *stale) : std::nullopt;
    if (!owner) {
      out.push_back({"stale attempt fenced by the database", Verdict::fail, "the store failed"});
      co_return out;
    }
    const auto s = co_await send(key, *stale, true, options_.body);
    const auto after_stale = co_await store_->read(req.id);
    const bool untouched = after_stale && *after_stale &&
                           (*after_stale)->state == store::State::in_progress &&
                           (*after_stale)->fence == owner->fence;
    const bool refused = !success(s) && s.response.find(gateway::kRecordedHeader) == s.response.end();
    out.push_back({"stale attempt fenced by the database",
                   untouched && refused ? Verdict::ok : Verdict::fail,
                   untouched && refused
                       ? "the stale attempt was refused (" + describe(s) + ") and recorded nothing"
                       : "the stale attempt was answered " + describe(s) +
                             (untouched ? "" : " and changed the record") +
                             ": call idemproxy_complete() or idemproxy_assert_owner() in the "
                             "transaction of the order"});

    const auto a = co_await send(key, *owner, true, options_.body);
    const auto rec = co_await store_->read(req.id);
    const auto recorded = a.response.find(gateway::kRecordedHeader);
    std::string location;
    if (auto it = a.response.find(http::field::location); it != a.response.end()) location = it->value();
    const bool marked = a.failure == upstream::Failure::none && recorded != a.response.end() &&
                        recorded->value() ==
                            idempotency::answer_digest(static_cast<int>(a.response.result_int()),
                                                       gateway::resource_id_from_location(location),
                                                       a.response.body());
    const bool completed = rec && *rec && (*rec)->state == store::State::completed &&
                           (*rec)->fence == owner->fence;
    out.push_back({"completion in the backend's transaction",
                   marked && completed ? Verdict::ok : Verdict::fail,
                   marked && completed
                       ? "the owner's answer (" + describe(a) + ") is recorded under its fencing "
                             "token, and the digest it sent back matches"
                       : std::string(completed ? "the record is completed" : "the record is not completed") +
                             (marked ? "" : "; X-Idempotency-Recorded is missing or is not the digest of "
                                            "the answer sent")});
    co_return out;
  }

  asio::awaitable<Check> directive() {
    Check c{"release directive", Verdict::skip,
            "not checked: --release-body FILE names a request the backend must not remember"};
    if (options_.release_body.empty()) co_return c;
    const std::string key = "verify-release-" + random_suffix();
    const auto owner = co_await claim(claim_request(key));
    if (!owner) co_return Check{c.name, Verdict::fail, "the store did not take the claim"};
    const auto a = co_await send(key, *owner, route_.completion == settings::Completion::backend,
                                 options_.release_body);
    const auto d = a.response.find(gateway::kDirectiveHeader);
    const bool released = a.failure == upstream::Failure::none && d != a.response.end() &&
                          idempotency::parse_directive(std::string_view(d->value())) ==
                              idempotency::Directive::release;
    co_return Check{c.name, released ? Verdict::ok : Verdict::fail,
                    released ? "answered " + describe(a) + " with X-Idempotency-Directive: release"
                             : "answered " + describe(a) + " without X-Idempotency-Directive: release"};
  }

  const VerifyOptions& options_;
  std::shared_ptr<const gateway::Runtime> runtime_;
  const settings::RouteSettings& route_;
  std::shared_ptr<pg::Pool> pool_;
  std::unique_ptr<store::PgStore> store_;
  std::unique_ptr<upstream::Pool> upstream_;
  std::vector<store::RecordId> claimed_;
};

}  // namespace

bool is_verify_option(std::string_view arg) {
  return arg == "--route" || arg == "--tenant" || arg == "--target" || arg == "--body" ||
         arg == "--release-body" || arg == "--header";
}

bool parse_verify_option(std::string_view arg, const std::string& value, VerifyOptions& v,
                         std::string& error) {
  if (arg == "--route") {
    v.route = value;
  } else if (arg == "--tenant") {
    v.tenant = value;
  } else if (arg == "--target") {
    v.target = value;
  } else if (arg == "--body" || arg == "--release-body") {
    std::ifstream in(value, std::ios::binary);
    if (!in) {
      error = "cannot read the " + std::string(arg) + " file '" + value + "'";
      return false;
    }
    (arg == "--body" ? v.body : v.release_body)
        .assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (arg == "--header") {
    const auto colon = value.find(':');
    if (colon == std::string::npos || colon == 0) {
      error = "--header takes 'Name: value'";
      return false;
    }
    auto field = value.substr(colon + 1);
    while (!field.empty() && field.front() == ' ') field.erase(0, 1);
    v.headers.emplace_back(value.substr(0, colon), field);
  } else {
    error = "unknown option " + std::string(arg);
    return false;
  }
  return true;
}

int verify_backend(const VerifyOptions& options) {
  const auto runtime = load_runtime(options.config_path);
  const settings::RouteSettings* route = nullptr;
  for (const auto& r : runtime->settings().routes) {
    if (r.name == options.route) route = &r;
  }
  if (route == nullptr) {
    std::cerr << "idemproxy: verify-backend: no route named '" << options.route << "' in "
              << options.config_path << "\n";
    return kExitUsage;
  }
  if (options.target.empty() && route->path.find('{') != std::string::npos) {
    std::cerr << "idemproxy: verify-backend: route '" << route->name
              << "' has a templated path; give a concrete one with --target\n";
    return kExitUsage;
  }
  std::cout << "verify-backend: route " << route->name << " ("
            << (route->completion == settings::Completion::backend ? "completion: backend"
                                                                   : "completion: sidecar")
            << ") against " << runtime->settings().upstream.url << ", tenant " << options.tenant
            << "\n";
  asio::io_context ioc{1};
  Verifier verifier(ioc, options, runtime, *route);
  auto done = asio::co_spawn(ioc, verifier.run(), asio::use_future);
  ioc.run();
  const auto checks = done.get();
  bool all_hold = true;
  for (const auto& c : checks) {
    const char* mark = c.verdict == Verdict::ok ? "[ok]  " : c.verdict == Verdict::fail ? "[FAIL]" : "[skip]";
    if (c.verdict == Verdict::fail) all_hold = false;
    std::cout << "  " << mark << " " << c.name << ": " << c.detail << "\n";
  }
  std::cout << (all_hold ? "every check that ran holds\n" : "the backend does not keep its side of the contract\n");
  return all_hold ? kExitOk : kExitFailure;
}

}  // namespace idem::app
