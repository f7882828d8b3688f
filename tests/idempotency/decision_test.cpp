// The duplicate-request state machine, checked exhaustively.
//
// The expectation is written independently of decision.cpp: instead of an ordered chain
// of ifs it is a table of DISJOINT patterns over the eight inputs, derived from the
// contract's prose, and the test first proves that every one of the 256 combinations
// matches exactly one pattern (so the table has no gaps and no overlaps) before
// comparing it with decide().
#include <doctest/doctest.h>

#include <array>
#include <set>
#include <string>

#include "idempotency/decision.hpp"

using idem::idempotency::Decision;
using idem::idempotency::decide;
using idem::idempotency::RowView;
using idem::idempotency::Situation;
using idem::idempotency::to_string;

namespace {

// Input order in a pattern:  P C F K Q L E W
//   P row present        C row completed       F fingerprint equal
//   K principal checked  Q principal equal     L lease expired
//   E retention expired  W wait budget left
// '1' true, '0' false, '-' either.
struct Rule {
  const char* pattern;
  Decision action;
  const char* why;
};

constexpr std::array kRules = {
    Rule{"0-------", Decision::claim_again, "the row vanished: claim again"},
    // Expired and finished (completed, or nobody holds a live lease): a new operation.
    Rule{"11----1-", Decision::replace_expired, "expired completed row"},
    Rule{"10---11-", Decision::replace_expired, "expired row whose lease also expired"},
    // Not replaceable and a different request: the key was reused.
    Rule{"1-0---0-", Decision::reject_mismatch, "live row, other fingerprint"},
    Rule{"100--01-", Decision::reject_mismatch, "expired but still leased row, other fingerprint"},
    // Same request but another principal.
    Rule{"1-110-0-", Decision::forbid, "live row, same fingerprint, other principal"},
    Rule{"1011001-", Decision::forbid, "expired-but-leased row, other principal"},
    // Completed and allowed: replay (a completed row that is expired was replaced above).
    Rule{"1110--0-", Decision::replay, "completed, principals not checked"},
    Rule{"11111-0-", Decision::replay, "completed, same principal"},
    // In progress with a dead lease and allowed: take over (expired + dead lease = replace).
    Rule{"1010-10-", Decision::take_over, "dead lease, principals not checked"},
    Rule{"1011110-", Decision::take_over, "dead lease, same principal"},
    // In progress with a live lease and allowed, expired or not: wait or say so.
    Rule{"1010-0-1", Decision::wait, "live lease, time left, principals not checked"},
    Rule{"101110-1", Decision::wait, "live lease, time left, same principal"},
    Rule{"1010-0-0", Decision::answer_in_progress, "live lease, no time left, principals not checked"},
    Rule{"101110-0", Decision::answer_in_progress, "live lease, no time left, same principal"},
};

bool matches(const char* pattern, unsigned bits) {
  for (int i = 0; i < 8; ++i) {
    const bool v = ((bits >> (7 - i)) & 1u) != 0;
    if (pattern[i] == '-') continue;
    if ((pattern[i] == '1') != v) return false;
  }
  return true;
}

std::string describe(unsigned bits) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(((bits >> (7 - i)) & 1u) ? '1' : '0');
  return s;
}

// Builds the Situation for a combination. Strings are chosen so "equal" and "differs"
// are real string comparisons, including the empty principal.
Situation situation(unsigned bits, RowView& row) {
  const auto bit = [&](int i) { return ((bits >> (7 - i)) & 1u) != 0; };
  const bool present = bit(0);
  row.completed = bit(1);
  row.fingerprint = "fp-stored";
  row.principal = "alice";
  row.attempt = 3;
  row.lease_expired = bit(5);
  row.expired = bit(6);

  Situation s;
  if (present) s.row = row;
  s.fingerprint = bit(2) ? std::string_view("fp-stored") : std::string_view("fp-other");
  s.check_principal = bit(3);
  s.principal = bit(4) ? std::string_view("alice") : std::string_view("mallory");
  s.wait_budget_left = bit(7);
  return s;
}

}  // namespace

TEST_CASE("decide: the expectation table is complete and disjoint") {
  for (unsigned bits = 0; bits < 256; ++bits) {
    int hits = 0;
    for (const auto& r : kRules) hits += matches(r.pattern, bits) ? 1 : 0;
    CAPTURE(describe(bits));
    CHECK(hits == 1);
  }
}

TEST_CASE("decide: every combination of inputs") {
  int checked = 0;
  for (unsigned bits = 0; bits < 256; ++bits) {
    const Rule* expected = nullptr;
    for (const auto& r : kRules) {
      if (matches(r.pattern, bits)) expected = &r;
    }
    REQUIRE(expected != nullptr);
    RowView row;
    const Situation s = situation(bits, row);
    const Decision got = decide(s);
    INFO("PCFKQLEW=", describe(bits), " expected ", to_string(expected->action), " (", expected->why, ") got ",
         to_string(got));
    CHECK(got == expected->action);
    ++checked;
  }
  CHECK(checked == 256);
}

TEST_CASE("decide: readable scenarios") {
  RowView row;
  row.fingerprint = "f";
  Situation s;
  s.fingerprint = "f";

  SUBCASE("no row") {
    CHECK(decide(s) == Decision::claim_again);
  }
  SUBCASE("completed: replay, even when the lease flag is stale") {
    row.completed = true;
    row.lease_expired = true;
    s.row = row;
    CHECK(decide(s) == Decision::replay);
  }
  SUBCASE("expired completed row is a new operation, even with another fingerprint") {
    row.completed = true;
    row.expired = true;
    s.row = row;
    s.fingerprint = "g";
    CHECK(decide(s) == Decision::replace_expired);
  }
  SUBCASE("expired in-progress row with a live lease is still running") {
    row.expired = true;
    s.row = row;
    s.wait_budget_left = true;
    CHECK(decide(s) == Decision::wait);
    s.wait_budget_left = false;
    CHECK(decide(s) == Decision::answer_in_progress);
    s.fingerprint = "g";
    CHECK(decide(s) == Decision::reject_mismatch);
  }
  SUBCASE("mismatch wins over principal") {
    row.completed = true;
    row.principal = "alice";
    s.row = row;
    s.fingerprint = "g";
    s.check_principal = true;
    s.principal = "bob";
    CHECK(decide(s) == Decision::reject_mismatch);
  }
  SUBCASE("another principal may neither replay nor take over") {
    row.principal = "alice";
    s.check_principal = true;
    s.principal = "bob";
    row.completed = true;
    s.row = row;
    CHECK(decide(s) == Decision::forbid);
    row.completed = false;
    row.lease_expired = true;
    s.row = row;
    CHECK(decide(s) == Decision::forbid);
  }
  SUBCASE("principals compared only when checked; empty is a value") {
    row.principal = "";
    row.completed = true;
    s.row = row;
    s.principal = "bob";
    CHECK(decide(s) == Decision::replay);
    s.check_principal = true;
    CHECK(decide(s) == Decision::forbid);
    s.principal = "";
    CHECK(decide(s) == Decision::replay);
  }
  SUBCASE("dead lease: take over") {
    row.lease_expired = true;
    s.row = row;
    CHECK(decide(s) == Decision::take_over);
  }
}

TEST_CASE("to_string names every action distinctly") {
  const std::array all = {Decision::claim_again, Decision::replace_expired, Decision::reject_mismatch,
                          Decision::forbid,      Decision::replay,          Decision::take_over,
                          Decision::wait,        Decision::answer_in_progress};
  std::set<std::string_view> names;
  for (const Decision a : all) {
    CHECK_FALSE(to_string(a).empty());
    CHECK(to_string(a) != "unknown");
    names.insert(to_string(a));
  }
  CHECK(names.size() == all.size());
  CHECK(to_string(Decision::take_over) == "take_over");
  CHECK(to_string(Decision::answer_in_progress) == "answer_in_progress");
}
