// The fingerprint memo (idempotency/fingerprint_memo.hpp): its key changes with every input
// the body parse and the fingerprint read, and it stays within its slots.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "idempotency/fingerprint_memo.hpp"

using namespace idem::idempotency;

namespace {

struct Input {
  std::string route = "create-order";
  std::string tenant = "t1";
  std::string method = "POST";
  std::string scope = "POST /orders";
  std::optional<std::string> content_type = std::string("application/json");
  std::vector<std::optional<std::string>> headers{std::string("v1")};
  std::string query;
  std::string body = R"({"amount":1})";

  MemoKey key() const {
    RequestParts p;
    p.method = method;
    p.scope = scope;
    if (content_type) p.content_type = std::string_view(*content_type);
    p.header_values = headers;
    p.query = query;
    p.body = body;
    return memo_key(route, tenant, p);
  }
};

const std::string kFp(64, 'a');

}  // namespace

TEST_CASE("the memo key is the same for the same request and differs with every input") {
  const Input base;
  CHECK(base.key() == Input{}.key());
  std::vector<Input> variants(13, base);
  variants[0].route = "create-order-2";
  variants[1].tenant = "t2";
  variants[2].method = "PUT";
  variants[3].scope = "POST /orders\n/orders/1";
  variants[4].content_type = std::nullopt;
  variants[5].content_type = std::string("application/json; charset=latin1");
  variants[6].headers = {std::nullopt};
  variants[7].headers = {std::string("")};
  variants[8].headers = {};
  variants[9].query = "a=1";
  variants[10].body = R"({"amount":2})";
  variants[11].body = R"({"amount": 1})";  // same JSON, other bytes: another key
  // Length prefixes: moving bytes from one item to the next is another input.
  variants[12].route = "create-orde";
  variants[12].tenant = "rt1";
  std::set<MemoKey> keys{base.key()};
  for (const auto& v : variants) keys.insert(v.key());
  CHECK(keys.size() == variants.size() + 1);
}

TEST_CASE("the memo answers what was kept for a key, and nothing for another") {
  FingerprintMemo memo(64);
  const auto k1 = Input{}.key();
  Input other;
  other.body = "{}";
  const auto k2 = other.key();
  CHECK_FALSE(memo.find(k1));
  memo.insert(k1, kFp);
  REQUIRE(memo.find(k1));
  CHECK(*memo.find(k1) == kFp);
  CHECK_FALSE(memo.find(k2));
  memo.clear();
  CHECK_FALSE(memo.find(k1));
}

TEST_CASE("the memo keeps only 64-digit fingerprints") {
  FingerprintMemo memo(8);
  const auto k = Input{}.key();
  memo.insert(k, "abc");
  CHECK_FALSE(memo.find(k));
}

TEST_CASE("a full memo replaces entries in their slot and never answers for another key") {
  FingerprintMemo memo(1);  // every key shares the one slot
  const auto k1 = Input{}.key();
  Input other;
  other.tenant = "t2";
  const auto k2 = other.key();
  memo.insert(k1, kFp);
  const std::string fp2(64, 'b');
  memo.insert(k2, fp2);
  CHECK_FALSE(memo.find(k1));
  REQUIRE(memo.find(k2));
  CHECK(*memo.find(k2) == fp2);
}
