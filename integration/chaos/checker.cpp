#include "checker.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>
#include <utility>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

namespace idem::chaos {

namespace json = boost::json;

namespace {

std::string seconds(std::int64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f s", static_cast<double>(us) / 1e6);
  return buf;
}

std::string who(const Operation& op) {
  return op.tenant + "/" + op.key + " (op " + std::to_string(op.id) + ")";
}

// "entry 12 attempt 3 (reuse, body 1) on replica 0, sent 1.2 s, got 201 replayed at 1.3 s"
std::string describe(const Plan& plan, const Attempt& a) {
  std::string s = "entry " + std::to_string(a.entry) + " attempt " + std::to_string(a.attempt) +
                  " (" + std::string(entry_kind_name(plan.entries.at(a.entry).kind)) + ", body " +
                  std::to_string(a.body) + ") on replica " + std::to_string(a.replica) +
                  ", sent " + seconds(a.sent_us) + ", got ";
  if (a.status == 0) {
    s += "no answer (" + a.error + ")";
  } else {
    s += std::to_string(a.status);
    if (!a.code.empty()) s += " " + a.code;
    if (a.replayed) s += " replayed";
  }
  return s + " at " + seconds(a.received_us);
}

bool is_result(const Attempt& a) {
  return a.definite() && a.answer_class() != AnswerClass::key_reused;
}

bool expected_definite(const Attempt& a) {
  if (a.answer_class() == AnswerClass::key_reused) return true;
  if (a.status == 201) return true;
  return a.status == 422 && a.code == "operation_id_reused";
}

// Compares a 201's order with the body its request asked for; "" when they agree.
std::string order_mismatch(const std::string& answer, const OrderBody& asked, std::string* order_id) {
  boost::system::error_code ec;
  const json::value doc = json::parse(answer, ec);
  if (ec || !doc.is_object()) return "the answer is not a JSON object";
  const json::object& o = doc.get_object();
  const auto text = [&](std::string_view name) -> std::optional<std::string> {
    const auto* v = o.if_contains(name);
    if (v == nullptr || !v->is_string()) return std::nullopt;
    return std::string(v->get_string());
  };
  const auto id = text("order_id");
  if (!id) return "the answer names no order_id";
  *order_id = *id;
  if (text("customer_id") != asked.customer_id) return "customer_id differs";
  if (text("currency") != asked.currency) return "currency differs";
  const auto* amount = o.if_contains("amount");
  if (amount == nullptr || !amount->is_int64() || amount->get_int64() != asked.amount) {
    return "amount differs";
  }
  if (text("checkout_id") != asked.checkout_id) return "checkout_id differs";
  return {};
}

class Checker {
 public:
  Checker(const Plan& plan, std::size_t entries, const std::vector<Attempt>& history,
          const Snapshot& snapshot)
      : plan_(plan), entries_(entries), history_(history), snapshot_(snapshot) {}

  CheckResult run() {
    result_.entries = entries_;
    index();
    settle_entries();
    for (const auto& [op, attempts] : by_operation_) check_operation(plan_.operations.at(op), attempts);
    check_rows();
    for (const auto& v : result_.violations) ++result_.violations_by_rule[v.rule];
    return std::move(result_);
  }

 private:
  void violation(std::string rule, std::string detail) {
    result_.violations.push_back({std::move(rule), std::move(detail)});
  }

  void index() {
    for (const auto& a : history_) {
      ++result_.requests;
      ++result_.answers[static_cast<std::size_t>(a.answer_class())];
      by_operation_[a.operation].push_back(&a);
      auto& last = last_of_entry_[a.entry];
      if (last == nullptr || a.attempt > last->attempt) last = &a;
      result_.max_attempts = std::max<std::size_t>(result_.max_attempts, a.attempt);
    }
    for (const auto& o : snapshot_.orders) {
      orders_by_id_[o.order_id] = &o;
      orders_by_customer_[{o.tenant, o.customer_id}].push_back(&o);
      if (o.checkout_id) orders_by_checkout_[{o.tenant, *o.checkout_id}].push_back(&o);
    }
    for (const auto& r : snapshot_.records) records_[{r.tenant, r.key}] = &r;
    result_.operations = by_operation_.size();
  }

  void settle_entries() {
    for (std::size_t e = 0; e < entries_; ++e) {
      const auto it = last_of_entry_.find(e);
      if (it == last_of_entry_.end()) {
        const auto& op = plan_.operations.at(plan_.entries.at(e).operation);
        violation("no_definite_answer", who(op) + ": entry " + std::to_string(e) + " sent nothing");
        continue;
      }
      if (!it->second->definite()) {
        const auto& op = plan_.operations.at(it->second->operation);
        violation("no_definite_answer", who(op) + ": last of " + describe(plan_, *it->second));
        continue;
      }
      ++result_.entries_settled;
    }
  }

  void check_operation(const Operation& op, const std::vector<const Attempt*>& attempts) {
    std::vector<const Attempt*> results, refusals;
    for (const Attempt* a : attempts) {
      if (!a->definite()) continue;
      if (!expected_definite(*a)) violation("unexpected_answer", who(op) + ": " + describe(plan_, *a));
      (is_result(*a) ? results : refusals).push_back(a);
    }
    if (results.empty()) {
      if (!refusals.empty()) {
        violation("no_result", who(op) + ": every definite answer refused the key as reused, "
                                         "e.g. " + describe(plan_, *refusals.front()));
      }
      return;
    }
    const Attempt* first = *std::min_element(results.begin(), results.end(), [](auto* a, auto* b) {
      return a->received_us < b->received_us;
    });
    std::set<int> bodies;
    std::vector<const Attempt*> first_answers;
    for (const Attempt* r : results) {
      bodies.insert(r->body);
      if (!r->replayed) first_answers.push_back(r);
      if (r->status != first->status || r->body_text != first->body_text) {
        violation("divergent_answers", who(op) + ": " + describe(plan_, *r) + " differs from " +
                                           describe(plan_, *first));
      }
    }
    if (bodies.size() > 1) {
      violation("two_bodies_succeeded", who(op) + ": both bodies got results under one key");
    }
    // Before the result was delivered, a key_reused can be right for the winning body
    // too: the other body held the key then (a claim that a 5xx released later). After
    // it, the record holds the winner's fingerprint, and the winner's body must replay.
    for (const Attempt* k : refusals) {
      if (k->body == first->body && k->sent_us > first->received_us) {
        violation("same_body_refused", who(op) + ": " + describe(plan_, *k) +
                                           " although that body's answer is " +
                                           describe(plan_, *first));
      }
    }
    if (first_answers.size() > 1) {
      std::string detail = who(op) + ": " + std::to_string(first_answers.size()) +
                           " first answers (not replayed):";
      for (const Attempt* a : first_answers) detail += "\n    " + describe(plan_, *a);
      violation("second_first_answer", detail);
    }
    if (first->status == 201) check_order(op, *first);

    for (const Attempt* a : attempts) {
      if (a->sent_us <= first->received_us) continue;
      const auto c = a->answer_class();
      const std::string context = " after " + describe(plan_, *first) + " was delivered";
      if (a->definite() && c != AnswerClass::key_reused && !a->replayed) {
        violation("executed_after_answer", who(op) + ": " + describe(plan_, *a) + context);
      } else if (c == AnswerClass::in_progress) {
        violation("in_progress_after_answer", who(op) + ": " + describe(plan_, *a) + context);
      } else if (c == AnswerClass::upstream_unavailable || c == AnswerClass::upstream_timeout ||
                 c == AnswerClass::backend_5xx) {
        violation("forwarded_after_answer", who(op) + ": " + describe(plan_, *a) + context);
      }
    }

    const auto record = records_.find({op.tenant, op.key});
    if (record == records_.end() || record->second->state != "completed") {
      violation("lost_record",
                who(op) + ": a client saw " + describe(plan_, *first) + ", but " +
                    (record == records_.end() ? std::string("no record exists for the key")
                                              : "the record is " + record->second->state) +
                    "; no completed record holds that answer");
    } else if (record->second->status != first->status || record->second->body != first->body_text) {
      violation("record_differs", who(op) + ": the completed record holds status " +
                                      std::to_string(record->second->status.value_or(0)) +
                                      " and other bytes than " + describe(plan_, *first));
    }
  }

  void check_order(const Operation& op, const Attempt& result) {
    std::string order_id;
    const std::string mismatch = order_mismatch(result.body_text, op.bodies.at(result.body), &order_id);
    if (!mismatch.empty()) {
      violation("answer_for_other_request", who(op) + ": " + mismatch + " in " + describe(plan_, result));
    }
    if (order_id.empty()) return;
    const auto it = orders_by_id_.find(order_id);
    if (it == orders_by_id_.end()) {
      violation("foreign_order", who(op) + ": " + describe(plan_, result) + " names order " +
                                     order_id + ", which does not exist");
      return;
    }
    const OrderRow& o = *it->second;
    if (o.tenant != op.tenant || o.customer_id != op.bodies[0].customer_id) {
      violation("foreign_order", who(op) + ": " + describe(plan_, result) + " names order " +
                                     order_id + " of " + o.tenant + "/" + o.customer_id);
    }
    answered_orders_.insert(order_id);
  }

  void check_rows() {
    for (const auto& r : snapshot_.records) {
      if (r.state == "in_progress") {
        violation("stuck_in_progress", r.tenant + "/" + r.key + " is still in progress (attempt " +
                                           std::to_string(r.attempt_token) + ")");
      }
    }
    for (const auto& [owner, orders] : orders_by_customer_) {
      ++result_.operations_with_order;
      if (orders.size() > 1) {
        std::string ids;
        for (const auto* o : orders) ids += " " + o->order_id;
        violation("duplicate_order", owner.first + "/" + owner.second + " has " +
                                         std::to_string(orders.size()) + " orders:" + ids);
      }
    }
    for (const auto& [checkout, orders] : orders_by_checkout_) {
      if (orders.size() > 1) {
        violation("duplicate_order", checkout.first + " checkout " + checkout.second + " has " +
                                         std::to_string(orders.size()) + " orders");
      }
    }
    for (const auto& o : snapshot_.orders) {
      if (!answered_orders_.contains(o.order_id)) ++result_.orders_without_result;
    }
    check_arrivals();
  }

  void check_arrivals() {
    std::map<Pair, std::string> key_of;  // (tenant, operation id) -> "tenant/customer"
    for (const auto& o : snapshot_.orders) {
      if (o.operation_id) key_of[{o.tenant, *o.operation_id}] = o.tenant + "/" + o.customer_id;
    }
    std::map<std::tuple<std::string, std::string, std::int64_t>, std::vector<std::int64_t>> seen;
    std::set<std::tuple<std::string, std::string, std::int64_t>> claimed;
    for (const auto& c : snapshot_.claims) claimed.insert({c.tenant, c.operation_id, c.fencing_token});
    for (const auto& a : snapshot_.arrivals) {
      ++result_.arrivals;
      if (!a.fencing_token) continue;
      ++result_.arrivals_with_token;
      seen[{a.tenant, a.operation_id, *a.fencing_token}].push_back(a.attempt);
      if (!snapshot_.claims_witnessed) continue;
      if (claimed.contains({a.tenant, a.operation_id, *a.fencing_token})) {
        ++result_.arrivals_with_claim;
        continue;
      }
      const auto named = key_of.find({a.tenant, a.operation_id});
      violation("forwarded_without_claim",
                (named != key_of.end() ? named->second : a.tenant + "/?") + " (operation " +
                    a.operation_id.substr(0, 12) + "): attempt " + std::to_string(a.attempt) +
                    " reached the backend with fencing token " + std::to_string(*a.fencing_token) +
                    ", which no claim the store holds ever carried: it was forwarded on a "
                    "claim that did not survive");
    }
    for (const auto& [id, attempts] : seen) {
      if (attempts.size() < 2) continue;
      const auto& [tenant, operation, token] = id;
      const auto named = key_of.find({tenant, operation});
      std::string list;
      for (const auto n : attempts) list += (list.empty() ? "" : ", ") + std::to_string(n);
      violation("fencing_token_reused",
                (named != key_of.end() ? named->second : tenant + "/?") + " (operation " +
                    operation.substr(0, 12) + "): " + std::to_string(attempts.size()) +
                    " requests reached the backend with fencing token " + std::to_string(token) +
                    " (attempts " + list + ")");
    }
  }

  using Pair = std::pair<std::string, std::string>;
  const Plan& plan_;
  std::size_t entries_;
  const std::vector<Attempt>& history_;
  const Snapshot& snapshot_;
  CheckResult result_;
  std::map<std::size_t, std::vector<const Attempt*>> by_operation_;
  std::map<std::size_t, const Attempt*> last_of_entry_;
  std::map<std::string, const OrderRow*> orders_by_id_;
  std::map<Pair, std::vector<const OrderRow*>> orders_by_customer_;
  std::map<Pair, std::vector<const OrderRow*>> orders_by_checkout_;
  std::map<Pair, const RecordRow*> records_;
  std::set<std::string> answered_orders_;
};

}  // namespace

CheckResult check(const Plan& plan, std::size_t entries, const std::vector<Attempt>& history,
                  const Snapshot& snapshot) {
  return Checker(plan, entries, history, snapshot).run();
}

}  // namespace idem::chaos
