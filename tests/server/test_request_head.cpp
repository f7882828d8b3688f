// The listener's header rules (server/request_head.hpp) on headers built by hand.
#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <utility>

#include <boost/beast/http/string_body.hpp>

#include "server/request_head.hpp"

namespace idem::server {
namespace {

using Fields = std::initializer_list<std::pair<const char*, const char*>>;

http::request<http::string_body> head(std::string target, Fields fields, unsigned version = 11,
                                      http::verb method = http::verb::post) {
  http::request<http::string_body> h;
  h.method(method);
  h.target(target);
  h.version(version);
  for (const auto& [name, value] : fields) h.insert(name, value);
  return h;
}

}  // namespace

TEST_CASE("request head: HTTP/1.1 needs exactly one valid Host") {
  auto none = head("/orders", {});
  CHECK_FALSE(prepare_request_head(none).ok);
  auto two = head("/orders", {{"Host", "a"}, {"Host", "a"}});
  CHECK_FALSE(prepare_request_head(two).ok);
  auto bad = head("/orders", {{"Host", "a/b"}});
  CHECK_FALSE(prepare_request_head(bad).ok);
  auto one = head("/orders", {{"Host", "a:8080"}});
  CHECK(prepare_request_head(one).ok);
  auto empty = head("/orders", {{"Host", ""}});
  CHECK(prepare_request_head(empty).ok);
}

TEST_CASE("request head: HTTP/1.0 may omit Host but not repeat it") {
  auto none = head("/orders", {}, 10);
  CHECK(prepare_request_head(none).ok);
  auto two = head("/orders", {{"Host", "a"}, {"Host", "b"}}, 10);
  CHECK_FALSE(prepare_request_head(two).ok);
}

TEST_CASE("request head: the target is normalized in place") {
  auto h = head("/x/../%6Frders?a=%6f", {{"Host", "a"}});
  REQUIRE(prepare_request_head(h).ok);
  CHECK(h.target() == "/orders?a=o");
  auto frag = head("/orders#top", {{"Host", "a"}});
  const auto check = prepare_request_head(frag);
  CHECK_FALSE(check.ok);
  CHECK_FALSE(check.problem.empty());
}

TEST_CASE("request head: an absolute-form target replaces the Host value") {
  auto h = head("http://Real.example/orders", {{"Host", "other.example"}});
  REQUIRE(prepare_request_head(h).ok);
  CHECK(h.target() == "/orders");
  CHECK(h.count(http::field::host) == 1);
  CHECK(h[http::field::host] == "real.example");

  auto old = head("http://real.example/orders", {}, 10);
  REQUIRE(prepare_request_head(old).ok);
  CHECK(old[http::field::host] == "real.example");
}

TEST_CASE("request head: OPTIONS * is the only asterisk-form") {
  auto opt = head("*", {{"Host", "a"}}, 11, http::verb::options);
  CHECK(prepare_request_head(opt).ok);
  auto get = head("*", {{"Host", "a"}}, 11, http::verb::get);
  CHECK_FALSE(prepare_request_head(get).ok);
}

TEST_CASE("request head: every Connection field counts for keep-alive") {
  auto h = head("/", {{"Host", "a"}, {"Connection", "keep-alive"}, {"X", "1"}, {"Connection", "close"}});
  CHECK(h.keep_alive());  // Beast alone reads the first field only
  REQUIRE(prepare_request_head(h).ok);
  CHECK_FALSE(h.keep_alive());
  CHECK(h.count(http::field::connection) == 1);
  CHECK(h[http::field::connection] == "keep-alive, close");

  auto old = head("/", {{"Connection", "X-A"}, {"Connection", "keep-alive"}}, 10);
  CHECK_FALSE(old.keep_alive());
  REQUIRE(prepare_request_head(old).ok);
  CHECK(old.keep_alive());

  auto single = head("/", {{"Host", "a"}, {"Connection", "close"}});
  REQUIRE(prepare_request_head(single).ok);
  CHECK(single[http::field::connection] == "close");
}

}  // namespace idem::server
