#pragma once
// What the test backend remembers between requests: every business call it saw (so a test
// can prove what the sidecar forwarded, and how often) and the named holds that keep an
// answer back until the test releases it.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json/array.hpp>

namespace idem::test_backend {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// One recorded request. Sessions keep a shared_ptr to their record so an exchange that
// outlives a /__reset still has somewhere to write its outcome (it is simply no longer
// listed).
struct CallRecord {
  std::uint64_t seq = 0;
  std::string method;
  std::string target;
  HeaderList headers;  // in arrival order, names as the client spelled them
  std::string body;
  std::int64_t arrived_us = 0;  // monotonic microseconds since the backend started
  // The backend finished its work on the request: after any hold and delay, after the
  // response was written (or the write failed, or the connection was reset on purpose).
  bool completed = false;
  bool responded = false;    // a response was written in full
  bool client_gone = false;  // the client had gone (or the write failed) when we answered
  int status = 0;            // status answered (0: none, e.g. close-before-response)
  std::optional<std::int64_t> completed_us;
};

class Recorder {
 public:
  Recorder();

  // Sequence numbers keep growing across /__reset so that "ord-<seq>" stays unique for
  // the life of the process, even for rows a previous test left in PostgreSQL.
  std::shared_ptr<CallRecord> record(std::string method, std::string target, HeaderList headers,
                                     std::string body);
  void mark_completed(CallRecord& call) const;
  void reset();
  boost::json::array to_json() const;

  std::int64_t now_us() const;

 private:
  std::chrono::steady_clock::time_point started_;
  std::uint64_t next_seq_ = 1;
  std::vector<std::shared_ptr<CallRecord>> calls_;
};

// Named holds. A release is sticky until reset(), so a test may release before the request
// arrives without a race. The backend runs one io_context on one thread, so no locking.
class Holds {
 public:
  // Completes once `name` is released (or a reset drains every waiter).
  boost::asio::awaitable<void> wait(std::string name);
  // Returns how many waiting exchanges were woken.
  std::size_t release(const std::string& name);
  // Forgets every release and wakes all current waiters, so a held exchange from an
  // earlier test never blocks a connection forever.
  void reset();

 private:
  struct Waiter {
    explicit Waiter(boost::asio::any_io_executor ex) : timer(std::move(ex)) {}
    boost::asio::steady_timer timer;
    bool woken = false;
  };
  static void wake(Waiter& w);

  std::set<std::string> released_;
  std::multimap<std::string, std::shared_ptr<Waiter>> waiting_;
};

}  // namespace idem::test_backend
