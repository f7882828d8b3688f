// The value syntax helpers, rule by rule.
#include <doctest/doctest.h>

#include <limits>

#include "settings/support.hpp"

using namespace idem::settings;
using idem::Millis;

TEST_CASE("parse_duration: every unit, nothing else") {
  CHECK(parse_duration("250ms") == Millis(250));
  CHECK(parse_duration("5s") == Millis(5000));
  CHECK(parse_duration("2m") == Millis(120'000));
  CHECK(parse_duration("24h") == Millis(86'400'000));
  CHECK(parse_duration("7d") == Millis(604'800'000));
  CHECK(parse_duration("0ms") == Millis(0));
  CHECK(parse_duration("007s") == Millis(7000));

  for (const char* bad : {"", "5", "-5s", "+5s", "5 s", " 5s", "5s ", "1.5s", "5S", "5sec", "5us", "s",
                          "ms", "5ms5", "0x10s", "1e3ms"}) {
    INFO(bad);
    CHECK_FALSE(parse_duration(bad).has_value());
  }
  // The largest representable number of days, and one more.
  const auto max_days = std::numeric_limits<Millis::rep>::max() / 86'400'000;
  CHECK(parse_duration(std::to_string(max_days) + "d") == Millis(max_days * 86'400'000));
  CHECK_FALSE(parse_duration(std::to_string(max_days + 1) + "d").has_value());
  CHECK_FALSE(parse_duration("99999999999999999999999ms").has_value());
}

TEST_CASE("parse_size: bytes and IEC units only") {
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("1024") == 1024u);
  CHECK(parse_size("10B") == 10u);
  CHECK(parse_size("64KiB") == 64u * 1024);
  CHECK(parse_size("1MiB") == 1u << 20);
  CHECK(parse_size("8MiB") == 8u << 20);
  CHECK(parse_size("2GiB") == std::size_t{2} << 30);
  for (const char* bad : {"", "-1", "1KB", "1kB", "1MB", "1GB", "1K", "1k", "1M", "1kib", "1 KiB", "1.5MiB",
                          "KiB", "1TiB", "0x10", "+5"}) {
    INFO(bad);
    CHECK_FALSE(parse_size(bad).has_value());
  }
  CHECK_FALSE(parse_size("99999999999999999999").has_value());
  CHECK_FALSE(parse_size("17179869184GiB").has_value());  // 2^64 bytes
}

TEST_CASE("durations and sizes render in the largest exact unit") {
  using detail::format_duration;
  using detail::format_size;
  CHECK(format_duration(Millis(250)) == "250ms");
  CHECK(format_duration(Millis(1500)) == "1500ms");
  CHECK(format_duration(Millis(5000)) == "5s");
  CHECK(format_duration(Millis(90'000)) == "90s");
  CHECK(format_duration(Millis(60'000)) == "1m");
  CHECK(format_duration(Millis(86'400'000)) == "1d");
  CHECK(format_duration(Millis(0)) == "0ms");
  CHECK(format_size(0) == "0");
  CHECK(format_size(1000) == "1000");
  CHECK(format_size(16u << 10) == "16KiB");
  CHECK(format_size(1536u << 10) == "1536KiB");
  CHECK(format_size(8u << 20) == "8MiB");
  CHECK(format_size(std::size_t{3} << 30) == "3GiB");
  for (long long ms : {1LL, 999LL, 1000LL, 61'000LL, 3'600'000LL, 7LL * 86'400'000}) {
    CHECK(parse_duration(format_duration(Millis(ms))) == Millis(ms));
  }
  for (std::size_t b : {std::size_t{1}, std::size_t{1023}, std::size_t{1} << 10, std::size_t{5} << 20}) {
    CHECK(parse_size(format_size(b)) == b);
  }
}

TEST_CASE("tokens, JSON pointers and JSON numbers") {
  CHECK(detail::is_token("Idempotency-Key"));
  CHECK(detail::is_token("X_Custom.Header~1"));
  CHECK_FALSE(detail::is_token(""));
  CHECK_FALSE(detail::is_token("Bad Name"));
  CHECK_FALSE(detail::is_token("a:b"));
  CHECK_FALSE(detail::is_token("caf\xc3\xa9"));

  CHECK(detail::is_json_pointer(""));
  CHECK(detail::is_json_pointer("/"));
  CHECK(detail::is_json_pointer("/a/b"));
  CHECK(detail::is_json_pointer("/items/*/sku"));
  CHECK(detail::is_json_pointer("/a~0b/c~1d"));
  CHECK_FALSE(detail::is_json_pointer("a"));
  CHECK_FALSE(detail::is_json_pointer("/a~"));
  CHECK_FALSE(detail::is_json_pointer("/a~2"));

  for (const char* good : {"0", "-0", "1", "-12", "1.5", "1e3", "1E+3", "2.5e-7", "100"}) {
    INFO(good);
    CHECK(detail::is_json_number(good));
  }
  for (const char* bad : {"", "-", "01", "+1", ".5", "1.", "1e", "0x10", "1_000", "NaN", "1 "}) {
    INFO(bad);
    CHECK_FALSE(detail::is_json_number(bad));
  }
  CHECK(detail::parse_int("-42") == -42);
  CHECK_FALSE(detail::parse_int("4 2").has_value());
  CHECK_FALSE(detail::parse_int("99999999999999999999").has_value());
}

TEST_CASE("endpoints") {
  auto e = detail::parse_endpoint("0.0.0.0:8080");
  CHECK(e.host == "0.0.0.0");
  CHECK(e.port == 8080);
  e = detail::parse_endpoint("[::]:443");
  CHECK(e.host == "::");
  CHECK(detail::format_endpoint(e) == "[::]:443");
  e = detail::parse_endpoint("sidecar.local:9901");
  CHECK(e.host == "sidecar.local");
  CHECK(detail::format_endpoint(e) == "sidecar.local:9901");
  for (const char* bad : {"", ":8080", "host", "host:", "host:x", "[::1]", "[::1]8080", "::1", "[1.2.3.4]:1",
                          "a..b:1", "-:1", "h:65536"}) {
    INFO(bad);
    CHECK_THROWS_AS(detail::parse_endpoint(bad), detail::SyntaxError);
  }
}

TEST_CASE("route paths and shapes") {
  for (const char* good : {"/", "/orders", "/orders/", "/tenants/{tid}/orders", "/{a}/{b}", "/v1.2/x-y"}) {
    INFO(good);
    CHECK_NOTHROW(detail::check_route_path(good));
  }
  for (const char* bad : {"", "orders", "/o?x", "/o#f", "/o p", "//o", "/a/../b", "/./a", "/o/{}", "/o/{id",
                          "/o/id}", "/o/{a}{b}", "/o/{a-b}", "/{x}/{x}"}) {
    INFO(bad);
    CHECK_THROWS_AS(detail::check_route_path(bad), detail::SyntaxError);
  }
  CHECK(detail::route_shape("/t/{tid}/o/{id}") == "/t/{}/o/{}");
  CHECK(detail::route_shape("/orders") == "/orders");
}

TEST_CASE("StoreSettings::stores") {
  StoreSettings s;
  CHECK(s.stores(200));
  CHECK(s.stores(299));
  CHECK(s.stores(400));
  CHECK(s.stores(422));
  CHECK_FALSE(s.stores(199));
  CHECK_FALSE(s.stores(300));
  CHECK_FALSE(s.stores(408));
  CHECK_FALSE(s.stores(425));
  CHECK_FALSE(s.stores(429));
  CHECK_FALSE(s.stores(500));
  s.statuses = {{201, 201}};
  s.except = {};
  CHECK(s.stores(201));
  CHECK_FALSE(s.stores(200));
  s.statuses.clear();
  CHECK_FALSE(s.stores(201));
}

TEST_CASE("json_quote") {
  CHECK(detail::json_quote("EUR") == "\"EUR\"");
  CHECK(detail::json_quote("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(detail::json_quote(std::string("\n\t\x01", 3)) == "\"\\n\\t\\u0001\"");
  CHECK(detail::json_quote("\xe2\x82\xac") == "\"\xe2\x82\xac\"");
}
