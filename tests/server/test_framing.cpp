// The smuggling rules, checked on headers built by hand: these cases must be refused
// whatever Beast's parser thinks of them.
#include <doctest/doctest.h>

#include <initializer_list>
#include <utility>

#include "server/framing.hpp"

namespace idem::server {
namespace {

using Fields = std::initializer_list<std::pair<http::field, const char*>>;

FramingCheck check(Fields fields, unsigned version = 11) {
  http::request_header<> h;
  h.method(http::verb::post);
  h.target("/orders");
  h.version(version);
  for (const auto& [name, value] : fields) h.insert(name, value);
  return inspect_framing(h);
}

constexpr auto CL = http::field::content_length;
constexpr auto TE = http::field::transfer_encoding;

}  // namespace

TEST_CASE("framing: no length and no coding means no body") {
  CHECK(check({}).framing == BodyFraming::none);
}

TEST_CASE("framing: a single valid Content-Length") {
  const auto f = check({{CL, "42"}});
  CHECK(f.framing == BodyFraming::length);
  CHECK(f.length == 42);
  CHECK(check({{CL, "0"}}).framing == BodyFraming::length);
  CHECK(check({{CL, "18446744073709551615"}}).length == UINT64_MAX);
}

TEST_CASE("framing: invalid Content-Length values are refused") {
  for (const char* v : {"", "-1", "+5", "5 5", "5, 5", "0x10", "1e3", "18446744073709551616",
                        "99999999999999999999999"}) {
    CAPTURE(v);
    CHECK(check({{CL, v}}).framing == BodyFraming::invalid);
  }
}

TEST_CASE("framing: duplicate Content-Length fields are refused even when equal") {
  CHECK(check({{CL, "5"}, {CL, "5"}}).framing == BodyFraming::invalid);
  CHECK(check({{CL, "5"}, {CL, "6"}}).framing == BodyFraming::invalid);
}

TEST_CASE("framing: Content-Length with Transfer-Encoding is refused in either order") {
  CHECK(check({{CL, "5"}, {TE, "chunked"}}).framing == BodyFraming::invalid);
  CHECK(check({{TE, "chunked"}, {CL, "5"}}).framing == BodyFraming::invalid);
  CHECK(check({{TE, "gzip"}, {CL, "5"}}).framing == BodyFraming::invalid);
}

TEST_CASE("framing: only exactly 'chunked' is accepted as Transfer-Encoding") {
  CHECK(check({{TE, "chunked"}}).framing == BodyFraming::chunked);
  CHECK(check({{TE, "Chunked"}}).framing == BodyFraming::chunked);
  for (const char* v : {"gzip", "identity", "gzip, chunked", "chunked, gzip", "chunked, chunked",
                        "chunked;x=1", "", "xchunked"}) {
    CAPTURE(v);
    CHECK(check({{TE, v}}).framing == BodyFraming::invalid);
  }
  CHECK(check({{TE, "chunked"}, {TE, "chunked"}}).framing == BodyFraming::invalid);
  CHECK(check({{TE, "gzip"}, {TE, "chunked"}}).framing == BodyFraming::invalid);
}

TEST_CASE("framing: Transfer-Encoding in HTTP/1.0 is refused") {
  CHECK(check({{TE, "chunked"}}, 10).framing == BodyFraming::invalid);
  CHECK(check({{CL, "3"}}, 10).framing == BodyFraming::length);
}

TEST_CASE("framing: refusals carry a reason") {
  CHECK_FALSE(check({{CL, "5"}, {CL, "5"}}).problem.empty());
  CHECK(check({{CL, "5"}}).problem.empty());
}

}  // namespace idem::server
