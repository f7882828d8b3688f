#include <doctest/doctest.h>

#include "common/time_text.hpp"

TEST_CASE("HTTP dates are IMF-fixdate, in whole seconds rounded down") {
  using idem::imf_fixdate_from_us;
  CHECK(imf_fixdate_from_us(0) == "Thu, 01 Jan 1970 00:00:00 GMT");
  CHECK(imf_fixdate_from_us(784111777'000000) == "Sun, 06 Nov 1994 08:49:37 GMT");
  CHECK(imf_fixdate_from_us(784111777'999999) == "Sun, 06 Nov 1994 08:49:37 GMT");
  CHECK(imf_fixdate_from_us(1'796'083'200'000000) == "Tue, 01 Dec 2026 00:00:00 GMT");
  CHECK(imf_fixdate_from_us(-1) == "Wed, 31 Dec 1969 23:59:59 GMT");
}

TEST_CASE("record timestamps are RFC 3339 in UTC with microseconds") {
  using idem::rfc3339_from_us;
  CHECK(rfc3339_from_us(0) == "1970-01-01T00:00:00.000000Z");
  CHECK(rfc3339_from_us(1'796'083'200'000001) == "2026-12-01T00:00:00.000001Z");
  CHECK(rfc3339_from_us(784111777'123456) == "1994-11-06T08:49:37.123456Z");
  CHECK(rfc3339_from_us(-1) == "1969-12-31T23:59:59.999999Z");
  // Past year 9999 the year takes the digits it needs (no record lives that long).
  CHECK(rfc3339_from_us(253'402'300'800'000000) == "10000-01-01T00:00:00.000000Z");
  CHECK(idem::imf_fixdate_from_us(253'402'300'799'000000) == "Fri, 31 Dec 9999 23:59:59 GMT");
}
