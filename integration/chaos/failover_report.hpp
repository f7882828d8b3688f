#pragma once
// What each failover of a --failover run did to the clients, from the history alone:
// when the primary was killed (or the switchover asked for), when another node accepted
// writes, how long protected requests were answered 503 idempotency_store_unavailable,
// and when the first success came back. Pure: unit-tested with hand-made histories.
//
// The nemesis writes, per failover step: "start" (the kill, or the switchover request),
// "promoted" (a node other than the old primary accepts a read-write session, asked
// directly) and "heal" (the old primary rejoined as the secondary). A failover's window
// runs from its start to the next failover's start (or the end of the history); answers
// are counted in the window they were received in.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "history.hpp"

namespace idem::chaos {

struct FailoverFigures {
  std::string kind;    // pg-failover, pg-failover-vanish, pg-switchover
  std::string detail;  // the start event's detail (which node)
  std::int64_t start_us = 0;
  std::int64_t promoted_us = -1;  // -1: no promotion recorded
  std::int64_t healed_us = -1;    // the old primary rejoined
  std::int64_t end_us = 0;        // the window's end
  std::size_t answers_503 = 0;    // store_unavailable answers received in the window
  std::int64_t first_503_us = -1;
  std::int64_t last_503_us = -1;
  // Every answer received from the start until that first new order, by class.
  std::map<std::string, std::size_t> until_created;
  // The first 2xx answer to a request sent after the start (a replay cache may answer
  // some without the store), and the recovery: the first new order (a 201 that is not a
  // replay, so a claim and a completion written to the new primary) to a request sent
  // after the first 503 (a switchover serves on for a moment before the old primary
  // drains), overall and per replica.
  std::int64_t first_success_us = -1;
  std::int64_t first_created_us = -1;
  std::array<std::int64_t, 2> first_created_by_replica{-1, -1};
};

std::vector<FailoverFigures> failover_figures(const std::vector<Attempt>& attempts,
                                              const std::vector<NemesisEvent>& events);

// "+6.12 s" style offsets and spans for the summary; "-" for a missing time.
std::string offset_text(std::int64_t from_us, std::int64_t at_us);

}  // namespace idem::chaos
