// The order API's body rules, without a server or a database.
#include <doctest/doctest.h>

#include <string>
#include <variant>

#include "http_util.hpp"
#include "order_request.hpp"

using namespace idem::demo;

namespace {

OrderRequest accepted(std::string_view body) {
  auto r = parse_order_request(body);
  if (auto* rej = std::get_if<Rejection>(&r)) {
    FAIL("refused: " << rej->code << ": " << rej->detail);
  }
  return std::get<OrderRequest>(r);
}

Rejection refused(std::string_view body) {
  auto r = parse_order_request(body);
  REQUIRE(std::holds_alternative<Rejection>(r));
  return std::get<Rejection>(r);
}

constexpr std::string_view kValid =
    R"({"customer_id":"c-42","currency":"USD","amount":1000,"items":[{"sku":"A-1","qty":2}],
        "checkout_id":"chk-1","coupon":"WELCOME10","trace_id":"ignored"})";

}  // namespace

TEST_CASE("a complete order is read field by field; unknown members are ignored") {
  const auto o = accepted(kValid);
  CHECK(o.customer_id == "c-42");
  CHECK(o.currency == "USD");
  CHECK(o.amount == 1000);
  REQUIRE(o.items.size() == 1);
  CHECK(o.items[0].sku == "A-1");
  CHECK(o.items[0].qty == 2);
  CHECK(o.checkout_id == "chk-1");
  CHECK(o.coupon == "WELCOME10");
}

TEST_CASE("defaults agree with the sidecar's fingerprint defaults") {
  const auto o = accepted(R"({"customer_id":"c","amount":5,"items":[{"sku":"s","qty":1}]})");
  CHECK(o.currency == "EUR");
  CHECK_FALSE(o.checkout_id);
  CHECK_FALSE(o.coupon);
  // null is "not given", like an absent member
  const auto n = accepted(
      R"({"customer_id":"c","amount":5,"items":[{"sku":"s","qty":1}],"checkout_id":null,"coupon":null,"currency":null})");
  CHECK(n.currency == "EUR");
  CHECK_FALSE(n.checkout_id);
}

TEST_CASE("1000, 1000.0 and 1e3 are the same amount, as in the fingerprint") {
  for (const char* amount : {"1000", "1000.0", "1e3", "10000e-1"}) {
    CAPTURE(amount);
    const auto o =
        accepted(std::string(R"({"customer_id":"c","items":[{"sku":"s","qty":1}],"amount":)") +
                 amount + "}");
    CHECK(o.amount == 1000);
  }
}

TEST_CASE("a malformed body is 400 invalid_request") {
  for (const char* body : {
           "",
           "not json",
           "[]",
           "{}",
           R"({"customer_id":"","amount":1,"items":[{"sku":"s","qty":1}]})",
           R"({"customer_id":"c","amount":1.5,"items":[{"sku":"s","qty":1}]})",
           R"({"customer_id":"c","amount":"10","items":[{"sku":"s","qty":1}]})",
           R"({"customer_id":"c","amount":1e300,"items":[{"sku":"s","qty":1}]})",
           R"({"customer_id":"c","amount":1,"items":[]})",
           R"({"customer_id":"c","amount":1,"items":[{"sku":"s","qty":0}]})",
           R"({"customer_id":"c","amount":1,"items":[{"qty":1}]})",
           R"({"customer_id":"c","amount":1,"items":[{"sku":"s","qty":1}],"currency":"eur"})",
           R"({"customer_id":"c","amount":1,"items":[{"sku":"s","qty":1}],"checkout_id":7})",
           R"({"customer_id":"c","amount":1,"items":[{"sku":"s","qty":1}],"coupon":""})",
       }) {
    CAPTURE(body);
    const auto r = refused(body);
    CHECK(r.status == 400);
    CHECK(r.code == "invalid_request");
  }
}

TEST_CASE("a well-formed order with amount <= 0 is 422 invalid_amount") {
  for (const char* amount : {"0", "-1", "-0.0"}) {
    CAPTURE(amount);
    const auto r =
        refused(std::string(R"({"customer_id":"c","items":[{"sku":"s","qty":1}],"amount":)") +
                amount + "}");
    CHECK(r.status == 422);
    CHECK(r.code == "invalid_amount");
  }
  // malformed wins over the business rule: that is what the client must fix first
  CHECK(refused(R"({"customer_id":"c","amount":0,"items":[]})").status == 400);
}

TEST_CASE("items are stored in one canonical form") {
  const auto o = accepted(
      R"({"customer_id":"c","amount":1,"items":[{"qty":2,"sku":"B"},{"sku":"A","qty":1.0}]})");
  CHECK(items_json(o.items) == R"([{"sku":"B","qty":2},{"sku":"A","qty":1}])");
}

TEST_CASE("command-line and URL parsers") {
  CHECK(parse_duration("250ms") == idem::Millis(250));
  CHECK(parse_duration("5s") == idem::Millis(5000));
  CHECK(parse_duration("24h") == idem::Millis(86'400'000));
  CHECK_FALSE(parse_duration("30"));
  CHECK_FALSE(parse_duration("-1s"));
  CHECK_FALSE(parse_duration("s"));

  auto url = parse_http_url("http://127.0.0.1:3001");
  REQUIRE(url);
  CHECK(url->host == "127.0.0.1");
  CHECK(url->port == 3001);
  CHECK(url->path_prefix.empty());
  url = parse_http_url("http://[::1]:8080/pay/");
  REQUIRE(url);
  CHECK(url->host == "::1");
  CHECK(url->path_prefix == "/pay");
  CHECK_FALSE(parse_http_url("https://x:1"));
  CHECK_FALSE(parse_http_url("http://x:0"));
  CHECK_FALSE(parse_http_url("http://u@x:1"));

  CHECK(is_uuid("123e4567-e89b-12d3-a456-426614174000"));
  CHECK_FALSE(is_uuid("123e4567e89b12d3a456426614174000"));
  CHECK_FALSE(is_uuid("123e4567-e89b-12d3-a456-42661417400g"));
}

TEST_CASE("a form-encoded order reads like the same JSON order") {
  auto form = [](std::string_view body) { return parse_order_form(body); };
  const auto json = accepted(R"({"customer_id":"c-42","currency":"EUR","amount":1000,
      "items":[{"sku":"A-1","qty":2},{"sku":"B 2","qty":1}],"checkout_id":"chk-1"})");
  for (const char* body : {
           "customer_id=c-42&currency=EUR&amount=1000&items[0][sku]=A-1&items[0][qty]=2&items[1][sku]=B+2&items[1][qty]=1&checkout_id=chk-1",
           "items[1][qty]=1&items[0][qty]=2&items[1][sku]=B%202&items[0][sku]=A-1&amount=1000&customer_id=c-42&checkout_id=chk-1",
           "customer_id=c-42&amount=1000&items[][sku]=A-1&items[][qty]=2&items[][sku]=B+2&items[][qty]=1&checkout_id=chk-1&metadata[source]=app&idempotency_key=k-1",
       }) {
    INFO(body);
    auto r = form(body);
    REQUIRE(std::holds_alternative<OrderRequest>(r));
    const auto& o = std::get<OrderRequest>(r);
    CHECK(o.customer_id == json.customer_id);
    CHECK(o.currency == json.currency);
    CHECK(o.amount == json.amount);
    CHECK(items_json(o.items) == items_json(json.items));
    CHECK(o.checkout_id == json.checkout_id);
  }
  for (const char* bad : {"customer_id=c-42&customer_id=c-43&amount=1&items[0][sku]=A&items[0][qty]=1",
                          "customer_id=c-42&amount=1&items[1][sku]=A&items[1][qty]=1",
                          "customer_id=c-42&amount=1&items[0][sku]=A&items[0][qty]=1&items[][sku]=B",
                          "customer_id=c-42&amount=1e3&items[0][sku]=A&items[0][qty]=1",
                          "customer_id=c-42&amount=%4&items[0][sku]=A&items[0][qty]=1",
                          "customer_id=c-42&amount=1&items[0]=A"}) {
    INFO(bad);
    auto r = form(bad);
    REQUIRE(std::holds_alternative<Rejection>(r));
    CHECK(std::get<Rejection>(r).status == 400);
  }
}

TEST_CASE("a protobuf-encoded order reads like the same JSON order") {
  // Order{customer_id:"c-42", amount:1000, items:[{sku:"A-1",qty:2}], checkout_id:"chk-1"},
  // with an unknown field 9 (a varint) that readers skip.
  const std::string msg("\x0a\x04" "c-42" "\x18\xe8\x07" "\x22\x07\x0a\x03" "A-1" "\x10\x02"
                        "\x48\x01" "\x2a\x05" "chk-1", 27);
  auto r = parse_order_protobuf(msg);
  REQUIRE(std::holds_alternative<OrderRequest>(r));
  const auto& o = std::get<OrderRequest>(r);
  CHECK(o.customer_id == "c-42");
  CHECK(o.currency == "EUR");
  CHECK(o.amount == 1000);
  CHECK(items_json(o.items) == R"([{"sku":"A-1","qty":2}])");
  CHECK(o.checkout_id == "chk-1");
  for (std::size_t cut = 1; cut < msg.size(); ++cut) {
    INFO(cut);
    auto truncated = parse_order_protobuf(std::string_view(msg).substr(0, cut));
    // A prefix is an order only where a field ends after the items (18: the items, 20: the
    // unknown field); any other is malformed, or misses what an order needs.
    CHECK(std::holds_alternative<Rejection>(truncated) == (cut != 18 && cut != 20));
  }
}
