#include "failover_report.hpp"

#include <algorithm>
#include <cstdio>

namespace idem::chaos {

namespace {

bool failover_fault(const std::string& name) {
  return name == "pg-failover" || name == "pg-failover-vanish" || name == "pg-switchover";
}

}  // namespace

std::vector<FailoverFigures> failover_figures(const std::vector<Attempt>& attempts,
                                              const std::vector<NemesisEvent>& events) {
  std::vector<FailoverFigures> out;
  for (const auto& e : events) {
    if (!failover_fault(e.fault)) continue;
    if (e.action == "start") {
      FailoverFigures f;
      f.kind = e.fault;
      f.detail = e.detail;
      f.start_us = e.at_us;
      out.push_back(std::move(f));
    } else if (!out.empty() && e.fault == out.back().kind) {
      if (e.action == "promoted" && out.back().promoted_us < 0) out.back().promoted_us = e.at_us;
      if (e.action == "heal" && out.back().healed_us < 0) out.back().healed_us = e.at_us;
    }
  }
  std::int64_t last_us = 0;
  for (const auto& a : attempts) last_us = std::max(last_us, a.received_us);
  for (const auto& e : events) last_us = std::max(last_us, e.at_us);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].end_us = i + 1 < out.size() ? out[i + 1].start_us : last_us + 1;
  }

  for (auto& f : out) {
    const auto earliest = [](std::int64_t& slot, std::int64_t at) {
      if (slot < 0 || at < slot) slot = at;
    };
    for (const auto& a : attempts) {
      if (a.received_us < f.start_us || a.received_us >= f.end_us) continue;
      const bool success = a.status >= 200 && a.status < 300;
      if (success && a.sent_us >= f.start_us) earliest(f.first_success_us, a.received_us);
      if (a.answer_class() == AnswerClass::store_unavailable) {
        ++f.answers_503;
        earliest(f.first_503_us, a.received_us);
        f.last_503_us = std::max(f.last_503_us, a.received_us);
      }
    }
    const std::int64_t outage_from = std::max(f.start_us, f.first_503_us);
    for (const auto& a : attempts) {
      if (a.received_us >= f.end_us || a.sent_us < outage_from) continue;
      if (a.answer_class() != AnswerClass::created) continue;
      earliest(f.first_created_us, a.received_us);
      if (a.replica >= 0 && a.replica < 2) {
        earliest(f.first_created_by_replica[static_cast<std::size_t>(a.replica)], a.received_us);
      }
    }
    for (const auto& a : attempts) {
      if (a.received_us < f.start_us || a.received_us >= f.end_us) continue;
      if (f.first_created_us >= 0 && a.received_us > f.first_created_us) continue;
      ++f.until_created[std::string(answer_class_name(a.answer_class()))];
    }
  }
  return out;
}

std::string offset_text(std::int64_t from_us, std::int64_t at_us) {
  if (at_us < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "+%.2f s", static_cast<double>(at_us - from_us) / 1e6);
  return buf;
}

}  // namespace idem::chaos
