#include "e2e_stack.hpp"

#include "test_support/problem.hpp"

#include <filesystem>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

namespace idem::it::e2e {

namespace json = boost::json;

#ifndef IDEM_ORDER_BACKEND_BIN
#define IDEM_ORDER_BACKEND_BIN ""
#endif

std::string order_backend_binary() {
  std::string path = env("IDEM_ORDER_BACKEND_BIN").value_or("");
  if (path.empty()) path = IDEM_ORDER_BACKEND_BIN;
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_regular_file(path, ec)) {
    throw Failure("idem_order_backend not found at '" + path +
                  "' (build it, or set IDEM_ORDER_BACKEND_BIN)");
  }
  return path;
}

// ------------------------------------------------------------------ BackendProcess

BackendProcess::BackendProcess(std::string command, std::vector<std::string> args)
    : command_(std::move(command)), args_(std::move(args)) {
  start();
}

BackendProcess::~BackendProcess() = default;
BackendProcess::BackendProcess(BackendProcess&&) noexcept = default;
BackendProcess& BackendProcess::operator=(BackendProcess&&) noexcept = default;

void BackendProcess::start() {
  const bool server = command_ != "relay";
  std::vector<std::string> args{command_, "--enable-fault-injection", "--database-url",
                                database_url()};
  if (server) {
    // First start: any free port; a restart takes the same one back, so the sidecar (or
    // the relay) that points at it keeps working.
    args.push_back("--listen");
    args.push_back("127.0.0.1:" + std::to_string(port_));
  }
  args.insert(args.end(), args_.begin(), args_.end());
  process_ = std::make_unique<Process>(ProcessOptions{
      .executable = order_backend_binary(),
      .args = std::move(args),
      .name = "order_backend_" + command_,
  });
  if (!server) {
    process_->wait_for_output("RELAY RUNNING");
    return;
  }
  // The port line is also the readiness signal: printed once the socket listens.
  const std::string line = process_->wait_for_output("LISTENING ");
  const auto port = std::stoul(line.substr(line.find("LISTENING ") + 10));
  if (port == 0 || port > 65535 || (port_ != 0 && port != port_)) {
    throw Failure(command_ + " reported an unexpected port: " + line);
  }
  port_ = static_cast<std::uint16_t>(port);
}

std::string BackendProcess::url() const { return "http://127.0.0.1:" + std::to_string(port_); }

void BackendProcess::restart() {
  if (process_->running()) process_->kill();
  start();
}

void BackendProcess::kill() { process_->kill(); }

bool BackendProcess::running() { return process_->running(); }

std::string BackendProcess::log_tail(std::size_t lines) const { return process_->log_tail(lines); }

// ---------------------------------------------------------------------- OrderStack

RouteOptions order_route(const StackOptions& options) {
  RouteOptions r;
  // As in config/demo.yaml: every field that makes the order what it is, nothing else.
  r.fingerprint_fields = std::vector<std::string>{"/customer_id", "/currency",    "/amount",
                                                  "/items",       "/checkout_id", "/coupon"};
  r.fingerprint_defaults = {{"/currency", "\"EUR\""}};
  r.retention = options.retention;
  r.lease = options.lease;
  r.wait = options.wait;
  if (!options.store_statuses.empty()) r.store_statuses = options.store_statuses;
  r.extra_yaml = "completion: " + options.completion + "\n" + options.route_yaml;
  return r;
}

OrderStack::OrderStack(StackOptions options) : options_(std::move(options)) {
  payments_ = std::make_unique<BackendProcess>("payments", std::vector<std::string>{});
  inventory_ = std::make_unique<BackendProcess>("inventory", std::vector<std::string>{});
  std::vector<std::string> api_args{
      "--operation-retention",
      options_.api_retention.empty() ? options_.retention : options_.api_retention};
  if (options_.record_arrivals) api_args.push_back("--record-arrivals");
  if (!options_.slow_order_time.empty()) {
    api_args.push_back("--slow-order-time");
    api_args.push_back(options_.slow_order_time);
  }
  api_ = std::make_unique<BackendProcess>("api", std::move(api_args));
  // Fast polling and retries: a test waits for the relay in milliseconds, not seconds.
  std::vector<std::string> relay_args{"--payments-url",    payments_->url(),
                                      "--inventory-url",   inventory_->url(),
                                      "--poll-interval",   "20ms",
                                      "--retry-backoff",   "100ms",
                                      "--max-backoff",     "1s",
                                      "--claim-lease",     "5s",
                                      "--request-timeout", "2s"};
  if (options_.deliver_twice) relay_args.push_back("--fault-deliver-twice");
  relay_ = std::make_unique<BackendProcess>("relay", std::move(relay_args));

  sidecar_options_.upstream_url = api_->url();
  sidecar_options_.log_level = "warn";
  sidecar_options_.database_pool_size = 8;
  sidecar_options_.routes = {order_route(options_)};
  for (const auto& r : options_.extra_routes) sidecar_options_.routes.push_back(r);
  sidecar_options_.extra_yaml = options_.sidecar_yaml;
  sidecar_options_.admin_listen = options_.admin_listen;
  sidecar_ = std::make_unique<Sidecar>(sidecar_options_);
}

OrderStack::~OrderStack() = default;

// -------------------------------------------------------------------- assertions

Counts counts(Db& db, const std::string& tenant) {
  const auto rows = db.query(R"sql(
SELECT (SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1),
       (SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1),
       (SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1 AND state = 'completed'),
       (SELECT count(*) FROM demo_orders.outbox WHERE tenant_id = $1),
       (SELECT count(*) FROM demo_orders.outbox WHERE tenant_id = $1 AND delivered_at IS NOT NULL),
       (SELECT count(*) FROM demo_payments.charges WHERE tenant_id = $1),
       (SELECT count(*) FROM demo_inventory.reservations WHERE tenant_id = $1))sql",
                             {tenant});
  const auto& r = rows.at(0);
  const auto n = [&](std::size_t i) { return std::stoll(r.at(i).value_or("0")); };
  return {n(0), n(1), n(2), n(3), n(4), n(5), n(6)};
}

// Retries until the answer is no longer "in progress" (a live lease of a dead owner),
// as a well-behaved client honouring Retry-After would, only faster.
HttpResponse retry_until_settled(OrderStack& stack, const std::string& body,
                                 const Headers& headers) {
  HttpResponse res;
  wait_until(
      [&] {
        auto client = stack.client();
        res = client.post("/orders", body, headers);
        return !(res.status == 409 && test::problem_code(res) == "idempotency_in_progress");
      },
      15s, "a retry to get past idempotency_in_progress");
  return res;
}

Counts wait_for_delivery(Db& db, const std::string& tenant, std::int64_t events, Millis timeout) {
  Counts c;
  wait_until(
      [&] {
        const auto dead = db.scalar_int(
            "SELECT count(*) FROM demo_orders.outbox WHERE tenant_id = $1 AND dead_at IS NOT NULL",
            {tenant});
        if (dead > 0) {
          fail("an outbox event of " + tenant + " is dead: " +
               db.scalar("SELECT last_error FROM demo_orders.outbox WHERE tenant_id = $1 "
                         "AND dead_at IS NOT NULL LIMIT 1",
                         {tenant})
                   .value_or(""));
        }
        c = counts(db, tenant);
        return c.outbox_delivered >= events;
      },
      timeout, "the relay to deliver " + std::to_string(events) + " event(s) of " + tenant);
  return c;
}

std::string order_body(const std::string& checkout, std::int64_t amount,
                       const std::string& coupon) {
  std::string body = R"({"customer_id":"c-42","currency":"EUR","amount":)" +
                     std::to_string(amount) + R"(,"items":[{"sku":"A-1","qty":2}])";
  if (!checkout.empty()) body += R"(,"checkout_id":")" + checkout + "\"";
  if (!coupon.empty()) body += R"(,"coupon":")" + coupon + "\"";
  return body + "}";
}

std::string json_member(const std::string& body, const std::string& member) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec || !v.is_object()) return {};
  const auto* m = v.get_object().if_contains(member);
  if (m == nullptr || !m->is_string()) return {};
  return std::string(m->get_string());
}

std::vector<OrderRow> orders_of(Db& db, const std::string& tenant) {
  std::vector<OrderRow> out;
  for (const auto& r : db.query(
           "SELECT order_id::text, attempt::text, operation_id, retired_operation_id, checkout_id "
           "FROM demo_orders.orders WHERE tenant_id = $1 ORDER BY created_at, order_id",
           {tenant})) {
    out.push_back(
        {r.at(0).value_or(""), std::stoll(r.at(1).value_or("0")), r.at(2), r.at(3), r.at(4)});
  }
  return out;
}

}  // namespace idem::it::e2e
