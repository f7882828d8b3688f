// idem_order_backend — the reference order backend that idemproxy protects, as four
// processes of one executable (docs/demo.md):
//
//   idem_order_backend api        POST /orders, GET /orders/{id}           (order_api.hpp)
//   idem_order_backend relay      outbox -> payments and inventory          (relay.hpp)
//   idem_order_backend payments   fake payment service, one charge per key (effect_service.hpp)
//   idem_order_backend inventory  fake inventory service, one reservation per key
//   idem_order_backend setup      create or update the demo schemas, then exit
//
// Every service creates its own schema at start (schema.hpp). Servers print
// "LISTENING <port>" on stdout once they accept connections (port 0 picks a free one);
// the relay prints "RELAY RUNNING". SIGINT/SIGTERM stop them gracefully.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "effect_service.hpp"
#include "http_server.hpp"
#include "order_api.hpp"
#include "relay.hpp"
#include "schema.hpp"

namespace {

using namespace idem;
using namespace idem::demo;
using tcp = asio::ip::tcp;

constexpr const char* kUsage = R"(usage: idem_order_backend <command> [options]

commands:
  api         the order API: POST /orders, GET /orders/{id}
  relay       the outbox relay: delivers OrderCreated to payments and inventory
  payments    the fake payment service: POST /charges
  inventory   the fake inventory service: POST /reservations
  setup       create or update the demo schemas in PostgreSQL, then exit

options:
  --database-url URL        libpq URI or conninfo (default: $DATABASE_URL)
  --listen HOST:PORT        api 127.0.0.1:3000, payments 127.0.0.1:3001,
                            inventory 127.0.0.1:3002; port 0 picks a free port
  --pool-size N             PostgreSQL connections (default 8, relay 2)
  --log-level LEVEL         trace | debug | info | warn | error (default info)
  --enable-fault-injection  honour the fault switches (tests only; see docs/demo.md)
api:
  --operation-retention D   how long an operation id stays one operation (default 24h);
                            set it to the sidecar route's retention
  --slow-order-time D       how long an order with a SLOW-… item takes (default 3s):
                            the demo's long operation (routes with async)
  --record-arrivals         record every sidecar arrival (operation, attempt, fencing
                            token) in demo_orders.arrivals (needs --enable-fault-injection)
relay:
  --payments-url URL        default http://127.0.0.1:3001
  --inventory-url URL       default http://127.0.0.1:3002
  --batch N                 events claimed at once (default 32)
  --poll-interval D         wait when nothing is due (default 200ms)
  --claim-lease D           how long a claim holds (default 30s)
  --request-timeout D       one delivery (default 5s)
  --retry-backoff D         first retry delay, doubled per attempt (default 1s)
  --max-backoff D           longest retry delay (default 60s)
  --fault-deliver-twice     send every delivery twice (needs --enable-fault-injection)

Durations: 250ms, 5s, 2m, 24h, 7d. Exit status: 0 ok, 2 usage, 1 failure.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string command;
  std::string database_url;
  std::optional<std::string> listen;
  std::optional<std::size_t> pool_size;
  std::string log_level = "info";
  bool fault_injection = false;
  OrderApiOptions api;
  RelayOptions relay;
  bool deliver_twice = false;
  bool record_arrivals = false;
};

Millis duration_arg(std::string_view name, std::string_view value) {
  const auto d = parse_duration(value);
  if (!d || *d <= Millis::zero()) {
    throw UsageError(std::string(name) + ": expected a duration such as 250ms, 5s or 24h, got '" +
                     std::string(value) + "'");
  }
  return *d;
}

std::size_t count_arg(std::string_view name, std::string_view value, std::size_t max) {
  const auto n = parse_int(value);
  if (!n || *n < 1 || static_cast<std::size_t>(*n) > max) {
    throw UsageError(std::string(name) + ": expected an integer from 1 to " + std::to_string(max) +
                     ", got '" + std::string(value) + "'");
  }
  return static_cast<std::size_t>(*n);
}

HttpUrl url_arg(std::string_view name, std::string_view value) {
  auto url = parse_http_url(value);
  if (!url) {
    throw UsageError(std::string(name) + ": expected http://host:port, got '" + std::string(value) +
                     "'");
  }
  return *url;
}

Options parse_args(int argc, char** argv) {
  if (argc < 2) throw UsageError("a command is required");
  Options o;
  o.command = argv[1];
  if (o.command == "--help" || o.command == "-h") {
    std::cout << kUsage;
    std::exit(0);
  }
  if (o.command != "api" && o.command != "relay" && o.command != "payments" &&
      o.command != "inventory" && o.command != "setup") {
    throw UsageError("unknown command '" + o.command + "'");
  }
  if (const char* env = std::getenv("DATABASE_URL")) o.database_url = env;
  o.relay.payments = *parse_http_url("http://127.0.0.1:3001");
  o.relay.inventory = *parse_http_url("http://127.0.0.1:3002");

  // Options that take a value, and what to do with it.
  const std::map<std::string_view, std::function<void(std::string_view, std::string_view)>> valued =
      {
          {"--database-url", [&](auto, auto v) { o.database_url = std::string(v); }},
          {"--listen", [&](auto, auto v) { o.listen = std::string(v); }},
          {"--pool-size", [&](auto n, auto v) { o.pool_size = count_arg(n, v, 64); }},
          {"--log-level", [&](auto, auto v) { o.log_level = std::string(v); }},
          {"--operation-retention",
           [&](auto n, auto v) { o.api.operation_retention = duration_arg(n, v); }},
          {"--slow-order-time",
           [&](auto n, auto v) { o.api.slow_order_time = duration_arg(n, v); }},
          {"--payments-url", [&](auto n, auto v) { o.relay.payments = url_arg(n, v); }},
          {"--inventory-url", [&](auto n, auto v) { o.relay.inventory = url_arg(n, v); }},
          {"--batch", [&](auto n, auto v) { o.relay.batch = count_arg(n, v, 1000); }},
          {"--poll-interval", [&](auto n, auto v) { o.relay.poll_interval = duration_arg(n, v); }},
          {"--claim-lease", [&](auto n, auto v) { o.relay.claim_lease = duration_arg(n, v); }},
          {"--request-timeout",
           [&](auto n, auto v) { o.relay.request_timeout = duration_arg(n, v); }},
          {"--retry-backoff", [&](auto n, auto v) { o.relay.retry_backoff = duration_arg(n, v); }},
          {"--max-backoff", [&](auto n, auto v) { o.relay.max_backoff = duration_arg(n, v); }},
      };
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--enable-fault-injection") {
      o.fault_injection = true;
    } else if (arg == "--fault-deliver-twice") {
      o.deliver_twice = true;
    } else if (arg == "--record-arrivals") {
      o.record_arrivals = true;
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (auto it = valued.find(arg); it != valued.end()) {
      if (i + 1 >= argc) throw UsageError(std::string(arg) + " needs a value");
      it->second(arg, argv[++i]);
    } else {
      throw UsageError("unknown option '" + std::string(arg) + "'");
    }
  }

  if (o.database_url.empty()) throw UsageError("--database-url (or DATABASE_URL) is required");
  if (spdlog::level::from_str(o.log_level) == spdlog::level::off && o.log_level != "off") {
    throw UsageError("--log-level: expected trace, debug, info, warn or error");
  }
  // Fault switches must be impossible to enable by accident: each needs the master flag.
  if (o.deliver_twice && !o.fault_injection) {
    throw UsageError("--fault-deliver-twice needs --enable-fault-injection");
  }
  if (o.deliver_twice && o.command != "relay") {
    throw UsageError("--fault-deliver-twice applies to the relay only");
  }
  if (o.record_arrivals && !o.fault_injection) {
    throw UsageError("--record-arrivals needs --enable-fault-injection");
  }
  if (o.record_arrivals && o.command != "api") {
    throw UsageError("--record-arrivals applies to the api only");
  }
  if (o.relay.claim_lease <= o.relay.request_timeout * 2) {
    // Both deliveries of an event must fit in the lease, or another relay could claim
    // the event while this one still delivers it (harmless, but wasteful and confusing).
    throw UsageError("--claim-lease must be more than twice --request-timeout");
  }
  o.relay.copies_per_delivery = o.deliver_twice ? 2 : 1;
  o.api.fault_injection = o.fault_injection;
  o.api.record_arrivals = o.record_arrivals;
  return o;
}

tcp::endpoint endpoint_arg(const std::string& listen) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) throw UsageError("--listen: expected HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto port = parse_int(std::string_view(listen).substr(colon + 1));
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec || !port || *port > 65535) {
    throw UsageError("--listen: expected HOST:PORT with a numeric address, got '" + listen + "'");
  }
  return {address, static_cast<unsigned short>(*port)};
}

std::shared_ptr<pg::Pool> make_pool(asio::io_context& ioc, const Options& o,
                                    std::vector<pg::PreparedStatement> statements,
                                    std::size_t default_size) {
  pg::PoolOptions p;
  p.conninfo = o.database_url;
  p.size = o.pool_size.value_or(default_size);
  p.connect_timeout = Millis(5'000);
  p.statement_timeout = Millis(5'000);
  p.acquire_timeout = Millis(5'000);
  p.application_name = "idem_order_backend " + o.command;
  p.statements = std::move(statements);
  return pg::Pool::create(ioc.get_executor(), std::move(p));
}

void setup_logging(const Options& o) {
  auto logger = spdlog::stderr_color_mt("idem_order_backend");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ " + o.command + " %v");
  logger->set_level(spdlog::level::from_str(o.log_level));
  // stderr goes to a file under the demo and the tests: a crash must not lose lines.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

// Runs until SIGINT/SIGTERM, then lets in-flight work finish (bounded) and returns.
// `drained` says whether nothing is in flight any more.
void run_until_signal(asio::io_context& ioc, const std::function<void()>& begin_stop,
                      const std::function<bool()>& drained, Millis grace) {
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  asio::steady_timer poll(ioc);
  auto deadline = SteadyClock::now();
  std::function<void(boost::system::error_code)> check = [&](boost::system::error_code) {
    if (drained() || SteadyClock::now() >= deadline) {
      ioc.stop();
      return;
    }
    poll.expires_after(Millis(20));
    poll.async_wait(check);
  };
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: stopping", sig);
    deadline = SteadyClock::now() + grace;
    begin_stop();
    check({});
  });
  ioc.run();
}

int run(const Options& o) {
  if (o.command == "setup") {
    for (auto owner : {SchemaOwner::orders, SchemaOwner::payments, SchemaOwner::inventory}) {
      ensure_schema(o.database_url, owner);
    }
    std::cout << "schemas demo_orders, demo_payments and demo_inventory are current" << std::endl;
    return 0;
  }

  asio::io_context ioc(1);
  ServerLimits limits;

  if (o.command == "relay") {
    ensure_schema(o.database_url, SchemaOwner::orders);
    auto pool = make_pool(ioc, o, Relay::statements(), 2);
    Relay relay(ioc.get_executor(), pool, o.relay);
    relay.start();
    if (o.fault_injection) spdlog::warn("fault injection is ENABLED (tests only)");
    std::cout << "RELAY RUNNING" << std::endl;
    run_until_signal(
        ioc, [&] { relay.stop(); }, [&] { return relay.stopped(); },
        o.relay.request_timeout * 2 + Millis(1'000));
    return 0;
  }

  std::shared_ptr<pg::Pool> pool;
  Handler handler;
  std::string default_listen;
  std::shared_ptr<OrderApi> api;
  std::shared_ptr<EffectService> effects;
  if (o.command == "api") {
    ensure_schema(o.database_url, SchemaOwner::orders);
    pool = make_pool(ioc, o, OrderApi::statements(), 8);
    api = std::make_shared<OrderApi>(pool, o.api);
    handler = [api](Request& req) { return api->handle(req); };
    default_listen = "127.0.0.1:3000";
  } else {
    const bool payments = o.command == "payments";
    const EffectKind kind = payments ? EffectKind::payment : EffectKind::reservation;
    ensure_schema(o.database_url, payments ? SchemaOwner::payments : SchemaOwner::inventory);
    pool = make_pool(ioc, o, EffectService::statements(kind), 8);
    effects = std::make_shared<EffectService>(pool, EffectServiceOptions{kind, o.fault_injection});
    handler = [effects](Request& req) { return effects->handle(req); };
    default_listen = payments ? "127.0.0.1:3001" : "127.0.0.1:3002";
  }

  HttpServer server(ioc.get_executor(), endpoint_arg(o.listen.value_or(default_listen)), limits,
                    std::move(handler), o.command);
  server.start();
  if (o.fault_injection) spdlog::warn("fault injection is ENABLED (tests only)");
  spdlog::info("listening on port {}", server.port());
  // The harness and scripts/demo wait for this line: it also says which port port 0 got.
  std::cout << "LISTENING " << server.port() << std::endl;
  run_until_signal(
      ioc, [&] { server.stop(); }, [&] { return server.active_requests() == 0; },
      limits.write_timeout);
  pool->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "idem_order_backend: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  setup_logging(options);
  try {
    return run(options);
  } catch (const UsageError& e) {
    std::cerr << "idem_order_backend: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
}
