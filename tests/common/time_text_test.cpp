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
