#pragma once
// The sidecar's composition: one worker per event-loop thread (its own store pool, replay
// cache decorator, upstream pool, gateway and listener on the shared port), the admin
// listener on worker 0's loop, the retention task and the change feed. Built from one
// configuration, started, drained and stopped by the `serve` command (commands.hpp).
#include <cstddef>
#include <memory>
#include <string>

#include "app/config.hpp"
#include "gateway/router.hpp"

namespace idem::app {

class Sidecar {
 public:
  // Builds everything; nothing is bound and nothing runs yet. Throws std::exception when a
  // component cannot be created.
  // `tls`: the contexts load_tls() built from the same configuration.
  Sidecar(std::shared_ptr<const gateway::Runtime> runtime, TlsMaterial tls);
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  // Binds the admin listener, then the request listeners (a client that finds the main
  // port open finds the admin port open too), spawns the retention task and the change
  // feed, and starts the worker threads. Throws if a listener cannot bind.
  void start();

  // The configuration requests see now, and a new one (already through plan_reload) with
  // its TLS contexts (new connections get them, open ones keep theirs) and its encryption
  // keys (load_key_ring; null without `encryption`): records are sealed with its active
  // key from now on.
  std::shared_ptr<const gateway::Runtime> runtime() const;
  void apply(std::shared_ptr<const gateway::Runtime> next, TlsMaterial tls,
             std::shared_ptr<const store::KeyRing> keys);
  bool change_feed_running() const;

  // The drain: stop accepting and close idle connections; in-flight requests go on.
  void begin_drain();
  std::size_t open_connections() const;
  // Owners between their claim and their last write, in every worker: with `async` routes
  // these outlive their client's connection (a 202 was sent).
  std::size_t owners_in_flight() const;
  // Stops the tasks, the pools and the loops, and joins the threads (after the drain).
  void stop();

  // "listening on HOST:PORT (N workers, upstream ..., database <masked>, admin ...)".
  std::string summary() const;

 private:
  struct Parts;
  std::unique_ptr<Parts> parts_;
};

}  // namespace idem::app
