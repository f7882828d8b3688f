// The one target normalization (server/target.hpp), case by case: what a backend that
// normalizes paths would run must be what idemproxy routes and forwards.
#include <doctest/doctest.h>

#include <string>

#include "server/target.hpp"

namespace idem::server {
namespace {

std::string norm(std::string_view raw, bool options = false) {
  const auto t = normalize_target(raw, options);
  const std::string what = std::string(raw) + ": " + std::string(t.problem);
  REQUIRE_MESSAGE(t.ok, what);
  return t.target;
}

bool refused(std::string_view raw, bool options = false) {
  return !normalize_target(raw, options).ok;
}

}  // namespace

TEST_CASE("target: origin-form is kept as it is when already normal") {
  CHECK(norm("/orders") == "/orders");
  CHECK(norm("/") == "/");
  CHECK(norm("/orders?x=1&y=2") == "/orders?x=1&y=2");
  CHECK(norm("/a/b/c;v=1,2@x:y!$&'()*+=") == "/a/b/c;v=1,2@x:y!$&'()*+=");
  CHECK(norm("/orders?") == "/orders?");  // an empty query is not no query
  CHECK(norm("/.well-known/x") == "/.well-known/x");
  CHECK(normalize_target("/orders", false).form == TargetForm::origin);
}

TEST_CASE("target: percent-encoded unreserved characters are decoded, others upper-cased") {
  CHECK(norm("/%6Frders") == "/orders");
  CHECK(norm("/%6frders") == "/orders");
  CHECK(norm("/%41%5a%30%2D%2E%5F%7E") == "/AZ0-._~");
  CHECK(norm("/a%2fb") == "/a%2Fb");  // an encoded '/' is data, not a separator
  CHECK(norm("/a%2Fb") == "/a%2Fb");
  CHECK(norm("/caf%c3%a9") == "/caf%C3%A9");
  CHECK(norm("/x?q=%6f%2f") == "/x?q=o%2F");
  CHECK(norm("/x?a=%00") == "/x?a=%00");  // a NUL in the query is data
}

TEST_CASE("target: dot segments are removed, also when they were percent-encoded") {
  CHECK(norm("/./orders") == "/orders");
  CHECK(norm("/x/../orders") == "/orders");
  CHECK(norm("/../orders") == "/orders");
  CHECK(norm("/a/b/../../orders") == "/orders");
  CHECK(norm("/%2e/orders") == "/orders");
  CHECK(norm("/x/%2E%2E/orders") == "/orders");
  CHECK(norm("/orders/.") == "/orders/");
  CHECK(norm("/orders/..") == "/");
  CHECK(norm("/a/./b/../c?x=/../y") == "/a/c?x=/../y");  // the query is not a path
  CHECK(norm("/a/.../b") == "/a/.../b");
  CHECK(norm("/a/..b/c") == "/a/..b/c");
}

TEST_CASE("target: RFC 3986 section 5.4 examples of dot-segment removal") {
  CHECK(remove_dot_segments("/a/b/c/./../../g") == "/a/g");
  CHECK(remove_dot_segments("/b/c/../../../g") == "/g");
  CHECK(remove_dot_segments("/b/c/./g/.") == "/b/c/g/");
  CHECK(remove_dot_segments("/b/c/g/..") == "/b/c/");
  CHECK(remove_dot_segments("/b/c/g;x=1/./y") == "/b/c/g;x=1/y");
  CHECK(remove_dot_segments("/b/c/g;x=1/../y") == "/b/c/y");
}

TEST_CASE("target: empty segments inside the path stay (the gateway refuses them near a route)") {
  CHECK(norm("/orders/") == "/orders/");
  CHECK(norm("/a//b") == "/a//b");
}

// Found writing fuzz/target's properties: "//evil.example/orders" was forwarded as it is
// (it resembles no route segment by segment), and a backend that parses the target as a
// URI reference (as Python's urllib.parse.urlsplit does) reads the host evil.example and
// the path /orders.
TEST_CASE("target: a path starting with \"//\" is refused, also when dot segments produce it") {
  for (const char* raw : {"//orders", "//evil.example/orders", "//", "/..//orders", "/.//orders",
                          "/%2e//orders", "/a/..//orders", "http://h//orders", "//orders?x=1"}) {
    CAPTURE(raw);
    const auto t = normalize_target(raw, false);
    CHECK_FALSE(t.ok);
    CHECK(t.problem.find("//") != std::string_view::npos);
  }
  CHECK(norm("//../orders") == "/orders");  // ".." removes the empty first segment
  CHECK(norm("/a//b") == "/a//b");
}

TEST_CASE("target: absolute-form becomes origin-form and gives the authority") {
  auto t = normalize_target("http://Example.COM:8080/%6Frders?x=1", false);
  REQUIRE(t.ok);
  CHECK(t.form == TargetForm::absolute);
  CHECK(t.target == "/orders?x=1");
  CHECK(t.authority == "example.com:8080");

  CHECK(norm("HTTPS://h/orders") == "/orders");
  CHECK(norm("http://h") == "/");
  CHECK(norm("http://h?x") == "/?x");
  CHECK(norm("http://[::1]:80/x/../orders") == "/orders");
  CHECK(normalize_target("http://[::1]:80/", false).authority == "[::1]:80");
}

TEST_CASE("target: ambiguous and malformed forms are refused") {
  CHECK(refused("/orders#x"));
  CHECK(refused("/orders?a#b"));
  CHECK(refused("http://h/orders#"));
  CHECK(refused("/%zz"));
  CHECK(refused("/%4"));
  CHECK(refused("/%"));
  CHECK(refused("/a%00b"));
  CHECK(refused("/a\\b"));
  CHECK(refused("/a b"));
  CHECK(refused("/a\"b"));
  CHECK(refused("/a<b>"));
  CHECK(refused("/a{b}"));
  CHECK(refused("/a|b"));
  CHECK(refused("/a[0]"));
  CHECK(refused("/caf\xc3\xa9"));
  CHECK(refused("/x?caf\xc3\xa9"));
  CHECK(refused("/x?a\x7f"));
  CHECK(refused("orders"));
  CHECK(refused("example.com:443"));  // authority-form (CONNECT)
  CHECK(refused("ftp://h/orders"));
  CHECK(refused("http://user@h/orders"));
  CHECK(refused("http:///orders"));
  CHECK(refused("http://:80/orders"));
  CHECK(refused("http://h:port/orders"));
  CHECK(refused("*"));
  CHECK(refused(""));
}

TEST_CASE("target: the query may carry characters clients leave unencoded") {
  CHECK(norm("/search?q={\"a\":[1|2]}\\^`") == "/search?q={\"a\":[1|2]}\\^`");
}

TEST_CASE("target: asterisk-form only for OPTIONS") {
  auto t = normalize_target("*", true);
  REQUIRE(t.ok);
  CHECK(t.form == TargetForm::asterisk);
  CHECK(t.target == "*");
}

TEST_CASE("target: Host values") {
  CHECK(valid_host_value(""));
  CHECK(valid_host_value("example.com"));
  CHECK(valid_host_value("example.com:8080"));
  CHECK(valid_host_value("127.0.0.1:80"));
  CHECK(valid_host_value("[::1]"));
  CHECK(valid_host_value("[::1]:8080"));
  CHECK(valid_host_value("a%41b"));
  CHECK(valid_host_value("h:"));  // port = *DIGIT
  CHECK_FALSE(valid_host_value(":80"));
  CHECK_FALSE(valid_host_value("h:80:90"));
  CHECK_FALSE(valid_host_value("h:123456"));
  CHECK_FALSE(valid_host_value("a b"));
  CHECK_FALSE(valid_host_value("a/b"));
  CHECK_FALSE(valid_host_value("user@h"));
  CHECK_FALSE(valid_host_value("[::1"));
  CHECK_FALSE(valid_host_value("[]"));
  CHECK_FALSE(valid_host_value("[::1]x"));
  CHECK_FALSE(valid_host_value("h\xff"));
  CHECK_FALSE(valid_host_value("a%4"));
}

}  // namespace idem::server
