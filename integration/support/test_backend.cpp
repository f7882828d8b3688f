#include "support/test_backend.hpp"

#include <signal.h>

#include <boost/json/parse.hpp>
#include <boost/json/parse_options.hpp>
#include <boost/json/value.hpp>

#include "support/env.hpp"

namespace idem::it {

namespace json = boost::json;

namespace {

std::string text(const json::value& v) {
  const auto& s = v.as_string();
  return std::string(s.data(), s.size());
}

BackendCall to_call(const json::value& v) {
  const auto& o = v.as_object();
  BackendCall call;
  call.seq = o.at("seq").to_number<std::uint64_t>();
  call.method = text(o.at("method"));
  call.target = text(o.at("target"));
  for (const auto& pair : o.at("headers").as_array()) {
    const auto& nv = pair.as_array();
    call.headers.emplace_back(text(nv.at(0)),
                              text(nv.at(1)));
  }
  call.body = text(o.at("body"));
  call.completed = o.at("completed").as_bool();
  call.responded = o.at("responded").as_bool();
  call.client_gone = o.at("client_gone").as_bool();
  call.status = o.at("status").to_number<int>();
  call.arrived_us = o.at("arrived_us").to_number<std::int64_t>();
  if (const auto& done = o.at("completed_us"); !done.is_null()) {
    call.completed_us = done.to_number<std::int64_t>();
  }
  return call;
}

}  // namespace

std::optional<std::string> BackendCall::header(std::string_view name) const {
  return test::header_value(headers, name);
}

std::vector<std::string> BackendCall::headers_named(std::string_view name) const {
  return test::header_values(headers, name);
}

TestBackend::TestBackend() : TestBackend(Options{}) {}

TestBackend::TestBackend(Options options) : options_(std::move(options)) {
  if (options_.binary.empty()) {
    options_.binary = test_backend_binary();
  }
  port_ = options_.port;
  start();
}

TestBackend::~TestBackend() = default;

void TestBackend::start() {
  std::vector<std::string> args = {"--port", std::to_string(port_)};
  if (!options_.tls_cert_file.empty()) {
    args.insert(args.end(), {"--tls-cert", options_.tls_cert_file, "--tls-key", options_.tls_key_file});
  }
  process_ = std::make_unique<Process>(ProcessOptions{
      .executable = options_.binary,
      .args = std::move(args),
      .name = "test_backend",
  });
  if (!options_.tls_cert_file.empty()) {
    // Printed before LISTENING. A restart picks a new TLS port (tls_url() follows).
    const std::string tls_line = process_->wait_for_output("LISTENING_TLS ", options_.start_timeout);
    tls_port_ = static_cast<std::uint16_t>(std::stoul(tls_line.substr(tls_line.find(' ') + 1)));
  }
  // The backend prints its port only once it listens, so this line is also the readiness
  // signal: no polling of the port, and no race with a port the kernel picked.
  const std::string line = process_->wait_for_output("LISTENING ", options_.start_timeout);
  const auto port = std::stoul(line.substr(line.find(' ') + 1));
  if (port == 0 || port > 65535 || (port_ != 0 && port != port_)) {
    throw Failure("test backend reported an unexpected port: " + line);
  }
  port_ = static_cast<std::uint16_t>(port);
  client_ = std::make_unique<HttpClient>(port_);
}

std::string TestBackend::url() const { return "http://127.0.0.1:" + std::to_string(port_); }

std::string TestBackend::tls_url(std::string_view host) const {
  return "https://" + std::string(host) + ":" + std::to_string(tls_port_);
}

HttpResponse TestBackend::control(std::string_view method, std::string_view target) {
  HttpResponse res = client_->request(method, target, {}, {}, 5s);
  if (res.status != 200) {
    throw Failure("test backend " + std::string(method) + " " + std::string(target) +
                  " answered " + std::to_string(res.status) + ": " + res.body);
  }
  return res;
}

std::vector<BackendCall> TestBackend::calls() {
  const HttpResponse res = control("GET", "/__calls");
  // Bodies and header values are recorded byte for byte; a test may send bytes that are
  // not UTF-8 (a non-JSON body), and they must come back unchanged rather than break here.
  json::parse_options options;
  options.allow_invalid_utf8 = true;
  const json::value parsed = json::parse(res.body, {}, options);  // outlives the loop
  std::vector<BackendCall> out;
  for (const auto& v : parsed.as_array()) {
    out.push_back(to_call(v));
  }
  return out;
}

std::vector<BackendCall> TestBackend::wait_for_calls(std::size_t n, Millis timeout) {
  std::vector<BackendCall> seen;
  wait_until(
      [&] {
        seen = calls();
        return seen.size() >= n;
      },
      timeout, "the test backend to record " + std::to_string(n) + " call(s)");
  return seen;
}

BackendCall TestBackend::wait_for_call(const std::function<bool(const BackendCall&)>& predicate,
                                       std::string_view description, Millis timeout) {
  std::optional<BackendCall> found;
  wait_until(
      [&] {
        for (auto& call : calls()) {
          if (predicate(call)) {
            found = std::move(call);
            return true;
          }
        }
        return false;
      },
      timeout, description);
  return std::move(*found);
}

void TestBackend::release(std::string_view name) {
  control("POST", "/__release/" + std::string(name));
}

void TestBackend::reset() { control("POST", "/__reset"); }

void TestBackend::stop(Millis timeout) {
  client_->close();
  if (!process_->running()) {
    return;
  }
  process_->signal(SIGTERM);
  if (!process_->wait_exit(timeout)) {
    process_->kill();
  }
}

void TestBackend::restart() {
  stop();
  start();
}

bool TestBackend::running() { return process_->running(); }

std::string TestBackend::log_tail(std::size_t lines) const { return process_->log_tail(lines); }

}  // namespace idem::it
