// Encryption at rest of stored answers (store/record_cipher.hpp), without a database:
// sealing hides headers and body, opening restores them, the record's identity and status
// bind the ciphertext, rotation keeps old keys readable, and key files parse strictly.
#include <doctest/doctest.h>

#include <string>

#include "store/record_cipher.hpp"

using namespace idem::store;

namespace {

EncryptionKey key_of(char fill) {
  EncryptionKey k{};
  k.fill(static_cast<std::uint8_t>(fill));
  return k;
}

StoredResponse answer() {
  StoredResponse r;
  r.status = 201;
  r.headers = {{"Location", "/orders/SECRET-ORDER-1"}, {"Content-Type", "application/json"}};
  r.body = std::string(R"({"order":"SECRET-ORDER-1","card":"4111"})") + std::string(1, '\0') + "tail";
  r.resource_id = "/orders/SECRET-ORDER-1";
  r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  return r;
}

const RecordId kId{"acme", "POST /orders", "key-1"};

bool contains(const StoredResponse& r, std::string_view needle) {
  if (r.body.find(needle) != std::string::npos) return true;
  for (const auto& h : r.headers) {
    if (h.name.find(needle) != std::string::npos || h.value.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("seal hides headers and body; open restores them exactly") {
  const KeyRing ring({{"k1", key_of(1)}}, "k1");
  const auto sealed = seal(ring, kId, answer());
  CHECK_FALSE(contains(sealed, "SECRET"));
  CHECK_FALSE(contains(sealed, "Location"));
  CHECK_FALSE(contains(sealed, "4111"));
  CHECK(is_sealed(sealed.body));
  REQUIRE(sealed.headers.size() == 1);
  CHECK(sealed.headers[0].name == ":sealed");
  CHECK(sealed_key_id(sealed.body) == "k1");
  // What stays in clear: the status, the resource id, the trace id.
  CHECK(sealed.status == 201);
  CHECK(sealed.resource_id == "/orders/SECRET-ORDER-1");
  const auto opened = open(ring, kId, sealed);
  REQUIRE(opened);
  CHECK(*opened == answer());
  // Deterministic for one record and answer: a retried completion writes the same bytes.
  CHECK(seal(ring, kId, answer()) == sealed);
  auto other = answer();
  other.body += "!";
  CHECK(seal(ring, kId, other).body != sealed.body);
}

TEST_CASE("a sealed answer opens only for its own record, status and key") {
  const KeyRing ring({{"k1", key_of(1)}}, "k1");
  const auto sealed = seal(ring, kId, answer());
  for (const RecordId& other : {RecordId{"evil", "POST /orders", "key-1"}, RecordId{"acme", "POST /other", "key-1"},
                                RecordId{"acme", "POST /orders", "key-2"}}) {
    OpenError why = OpenError::unknown_key;
    CHECK_FALSE(open(ring, other, sealed, &why));
    CHECK(why == OpenError::invalid);
  }
  auto restatus = sealed;
  restatus.status = 200;
  CHECK_FALSE(open(ring, kId, restatus));
  // Headers and body are bound to their part: swapping them does not open.
  auto flipped = sealed;
  flipped.body.back() = static_cast<char>(flipped.body.back() ^ 1);
  CHECK_FALSE(open(ring, kId, flipped));
  auto stripped = sealed;
  stripped.headers.clear();
  CHECK_FALSE(open(ring, kId, stripped));
  // Another key with the same id (a row copied to a deployment with other keys).
  const KeyRing impostor({{"k1", key_of(2)}}, "k1");
  CHECK_FALSE(open(impostor, kId, sealed));
  OpenError why = OpenError::invalid;
  const KeyRing without({{"k9", key_of(1)}}, "k9");
  CHECK_FALSE(open(without, kId, sealed, &why));
  CHECK(why == OpenError::unknown_key);
}

TEST_CASE("rotation: the active key seals, every listed key opens") {
  const KeyRing old_ring({{"2026-01", key_of(1)}}, "2026-01");
  const auto old_sealed = seal(old_ring, kId, answer());
  const KeyRing rotated({{"2026-01", key_of(1)}, {"2026-06", key_of(7)}}, "2026-06");
  CHECK(open(rotated, kId, old_sealed) == answer());
  const auto new_sealed = seal(rotated, kId, answer());
  CHECK(sealed_key_id(new_sealed.body) == "2026-06");
  CHECK(open(rotated, kId, new_sealed) == answer());
  // Retiring the old key leaves its records unreadable, not readable by the wrong key.
  const KeyRing retired({{"2026-06", key_of(7)}}, "2026-06");
  CHECK_FALSE(open(retired, kId, old_sealed));
}

TEST_CASE("answers in clear (older records, completion: backend) read as they are") {
  const KeyRing ring({{"k1", key_of(1)}}, "k1");
  CHECK(open(ring, kId, answer()) == answer());
  auto omitted = answer();
  omitted.body.clear();
  omitted.body_omitted = true;
  const auto sealed = seal(ring, kId, omitted);
  CHECK(sealed.body.empty());  // an omitted body stays NULL
  CHECK(open(ring, kId, sealed) == omitted);
  // Half sealed is refused rather than guessed at.
  auto half = seal(ring, kId, answer());
  half.headers = answer().headers;
  CHECK_FALSE(open(ring, kId, half));
}

TEST_CASE("key rings and key files are strict") {
  CHECK_THROWS_AS(KeyRing({{"k1", key_of(1)}}, "k2"), std::invalid_argument);
  CHECK_THROWS_AS(KeyRing({{"bad id", key_of(1)}}, "bad id"), std::invalid_argument);
  const auto hex = parse_key_file(std::string(64, 'a') + "\n");
  CHECK(hex == key_of(static_cast<char>(0xaa)));
  const auto b64 = parse_key_file("qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqo=\n");
  CHECK(b64 == key_of(static_cast<char>(0xaa)));
  for (const std::string& bad : {std::string(63, 'a'), std::string(64, 'g'), std::string("short"), std::string(32, 'x'),
                                std::string("qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq==")}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_key_file(bad), std::invalid_argument);
  }
}
