#pragma once
// The history of a fault-injection run: every request a client sent and what came back,
// and every fault the nemesis injected, with times on one clock (microseconds since the
// run started, steady). Written as JSON lines while the run goes (history.jsonl in the
// run's directory), kept in memory for the checker.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace idem::chaos {

// Microseconds since the run's clock started (steady; the first call starts it). Every
// time in the history is on this clock.
std::int64_t run_clock_us();

// What one request got, in the classes the summary counts.
enum class AnswerClass {
  created,            // 2xx, first answer (no Idempotent-Replayed)
  replayed,           // 2xx or 4xx with Idempotent-Replayed: true
  refused,            // 4xx answered by the backend, first answer (e.g. 422)
  key_reused,         // 409/422 idempotency_key_reused
  in_progress,        // 409 idempotency_in_progress
  store_unavailable,  // 503 idempotency_store_unavailable
  upstream_unavailable,  // 502 upstream_unavailable (not sent; key released)
  upstream_timeout,   // 504 upstream_timeout, 502 upstream_invalid_response (outcome unknown)
  backend_5xx,        // a 5xx of the backend, passed through (the key was released)
  other_5xx,          // a 5xx nobody above explains
  other_4xx,          // a 4xx that is not an answer of the order API's contract
  no_answer,          // connection refused, reset, closed or timed out
};
inline constexpr std::size_t kAnswerClasses = 12;
std::string_view answer_class_name(AnswerClass c);

struct Attempt {
  std::size_t entry = 0;
  int attempt = 0;  // 1, 2, ... within the entry
  std::size_t operation = 0;
  std::string tenant;
  std::string key;
  int body = 0;
  std::uint32_t form = 0;
  int replica = 0;
  std::int64_t sent_us = 0;
  std::int64_t received_us = 0;
  int status = 0;  // 0: no answer
  std::string code;  // problem+json "code", if any
  bool replayed = false;
  std::string location;
  std::string retry_after;
  std::string body_text;  // kept for definite answers only
  std::string error;      // why there was no answer

  AnswerClass answer_class() const;
  // Settles the entry: the client stops retrying (contract: 2xx and 4xx, except
  // idempotency_in_progress and 408/425/429).
  bool definite() const;
};

struct NemesisEvent {
  std::int64_t at_us = 0;
  std::string action;  // "start" or "heal"
  std::string fault;   // kind, e.g. "pause"
  std::string detail;  // target and parameters
};

class History {
 public:
  // Creates (truncates) `file`.
  explicit History(const std::filesystem::path& file);

  // Thread-safe.
  void add(Attempt a);
  void add(NemesisEvent e);
  void flush();

  // Only once every writer is done.
  const std::vector<Attempt>& attempts() const { return attempts_; }
  const std::vector<NemesisEvent>& events() const { return events_; }

 private:
  std::mutex mutex_;
  std::ofstream out_;
  std::vector<Attempt> attempts_;
  std::vector<NemesisEvent> events_;
};

std::string to_json_line(const Attempt& a);
std::string to_json_line(const NemesisEvent& e);

}  // namespace idem::chaos
