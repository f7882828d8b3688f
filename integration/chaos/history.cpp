#include "history.hpp"

#include <array>
#include <chrono>
#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

namespace idem::chaos {

namespace json = boost::json;

std::int64_t run_clock_us() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

std::string_view answer_class_name(AnswerClass c) {
  static constexpr std::array<std::string_view, kAnswerClasses> names{
      "created",          "replayed",           "refused",          "key_reused",
      "in_progress",      "store_unavailable",  "upstream_unavailable", "upstream_timeout",
      "backend_5xx",      "other_5xx",          "other_4xx",        "no_answer"};
  return names.at(static_cast<std::size_t>(c));
}

AnswerClass Attempt::answer_class() const {
  if (status == 0) return AnswerClass::no_answer;
  if (status >= 200 && status < 300) return replayed ? AnswerClass::replayed : AnswerClass::created;
  if (code == "idempotency_key_reused") return AnswerClass::key_reused;
  if (code == "idempotency_in_progress") return AnswerClass::in_progress;
  if (code == "idempotency_store_unavailable") return AnswerClass::store_unavailable;
  if (code == "upstream_unavailable") return AnswerClass::upstream_unavailable;
  if (code == "upstream_timeout" || code == "upstream_invalid_response") {
    return AnswerClass::upstream_timeout;
  }
  if (status >= 500) {
    // The order API's own 5xx answers (order_api.cpp), passed through by the sidecar.
    if (code == "store_unavailable" || code == "injected_fault") return AnswerClass::backend_5xx;
    return AnswerClass::other_5xx;
  }
  if (replayed) return AnswerClass::replayed;
  // The business answers of the order API the run can provoke.
  if (code == "operation_id_reused") return AnswerClass::refused;
  return AnswerClass::other_4xx;
}

bool Attempt::definite() const {
  if (status < 200 || status >= 500) return false;
  if (status == 408 || status == 425 || status == 429) return false;
  return code != "idempotency_in_progress";
}

// ------------------------------------------------------------------------- History

History::History(const std::filesystem::path& file) : out_(file, std::ios::trunc) {}

void History::add(Attempt a) {
  const std::string line = to_json_line(a);
  std::lock_guard lock(mutex_);
  out_ << line << '\n';
  attempts_.push_back(std::move(a));
}

void History::add(NemesisEvent e) {
  const std::string line = to_json_line(e);
  std::lock_guard lock(mutex_);
  out_ << line << '\n';
  events_.push_back(std::move(e));
}

void History::flush() {
  std::lock_guard lock(mutex_);
  out_.flush();
}

std::string to_json_line(const Attempt& a) {
  json::object o{{"type", "request"},
                 {"entry", a.entry},
                 {"attempt", a.attempt},
                 {"op", a.operation},
                 {"tenant", a.tenant},
                 {"key", a.key},
                 {"body", a.body},
                 {"form", a.form},
                 {"replica", a.replica},
                 {"sent_us", a.sent_us},
                 {"received_us", a.received_us},
                 {"status", a.status},
                 {"class", answer_class_name(a.answer_class())}};
  if (!a.code.empty()) o["code"] = a.code;
  if (a.replayed) o["replayed"] = true;
  if (!a.location.empty()) o["location"] = a.location;
  if (!a.retry_after.empty()) o["retry_after"] = a.retry_after;
  if (!a.body_text.empty()) o["response"] = a.body_text;
  if (!a.error.empty()) o["error"] = a.error;
  return json::serialize(o);
}

std::string to_json_line(const NemesisEvent& e) {
  return json::serialize(json::object{{"type", "nemesis"},
                                      {"at_us", e.at_us},
                                      {"action", e.action},
                                      {"fault", e.fault},
                                      {"detail", e.detail}});
}

}  // namespace idem::chaos
