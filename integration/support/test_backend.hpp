#pragma once
// Drives an idem_test_backend process: the order API that the sidecar forwards to. Tests
// steer its answers with X-Test-* request headers (see integration/test_backend/main.cpp)
// and inspect what it received through calls(), which is how a test proves how many times
// an operation really reached the backend, and with which headers.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/http.hpp"
#include "support/process.hpp"

namespace idem::it {

// One business request as the backend recorded it.
struct BackendCall {
  std::uint64_t seq = 0;  // grows for the life of the backend process, across reset()
  std::string method;
  std::string target;
  Headers headers;  // in arrival order, names as sent
  std::string body;
  bool completed = false;    // the backend finished with it (after any hold and delay)
  bool responded = false;    // a response was written in full
  bool client_gone = false;  // the connection had gone when the backend answered
  int status = 0;            // status the backend answered (0 if none)
  std::int64_t arrived_us = 0;  // backend's monotonic clock
  std::optional<std::int64_t> completed_us;

  std::optional<std::string> header(std::string_view name) const;  // case-insensitive, first
  std::vector<std::string> headers_named(std::string_view name) const;
};

class TestBackend {
 public:
  struct Options {
    std::uint16_t port = 0;  // 0: the kernel picks one
    std::string binary;      // empty: test_backend_binary() (env.hpp)
    Millis start_timeout = kDefaultTimeout;
    // Also serve over TLS with this certificate and key (PEM files): tls_url().
    std::string tls_cert_file;
    std::string tls_key_file;
  };

  TestBackend();
  explicit TestBackend(Options options);
  ~TestBackend();

  std::uint16_t port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:<port>
  std::uint16_t tls_port() const { return tls_port_; }
  // https://<host>:<tls port> (with Options::tls_cert_file); host as the test names it.
  std::string tls_url(std::string_view host = "localhost") const;

  std::vector<BackendCall> calls();
  // Waits until at least `n` calls were recorded and returns them all.
  std::vector<BackendCall> wait_for_calls(std::size_t n, Millis timeout = kDefaultTimeout);
  // Waits until a recorded call satisfies `predicate` and returns that call.
  BackendCall wait_for_call(const std::function<bool(const BackendCall&)>& predicate,
                            std::string_view description, Millis timeout = kDefaultTimeout);
  // Lets every exchange held with X-Test-Hold: name answer; also later ones, until reset().
  void release(std::string_view name);
  // Forgets calls and releases, and lets exchanges still held answer.
  void reset();

  // Stops the process (SIGTERM, then SIGKILL after `timeout`): the upstream goes away.
  void stop(Millis timeout = 5s);
  // Starts it again on the same port (after stop() or a kill), e.g. to end an outage.
  void restart();
  bool running();
  Process& process() { return *process_; }
  std::string log_tail(std::size_t lines = 40) const;

 private:
  void start();
  HttpResponse control(std::string_view method, std::string_view target);

  Options options_;
  std::uint16_t port_ = 0;
  std::uint16_t tls_port_ = 0;
  std::unique_ptr<Process> process_;
  std::unique_ptr<HttpClient> client_;
};

}  // namespace idem::it
