// Problem documents must be valid JSON whatever the detail contains. Boost.JSON is
// compiled into this test (header-only mode) only to parse what make_problem produced.
#include <doctest/doctest.h>

#include <boost/json/src.hpp>

#include "server/server.hpp"

namespace idem::server {

TEST_CASE("problem: RFC 9457 shape, content type and length") {
  const auto res = make_problem(http::status::payload_too_large, "request_too_large",
                                "Content Too Large", "the body exceeds 1024 bytes");
  CHECK(res.result() == http::status::payload_too_large);
  CHECK(res[http::field::content_type] == "application/problem+json");
  CHECK(res[http::field::content_length] == std::to_string(res.body().size()));
  CHECK(res.keep_alive());

  const auto doc = boost::json::parse(res.body()).as_object();
  CHECK(doc.at("type").as_string() == "urn:idemproxy:problem:request_too_large");
  CHECK(doc.at("title").as_string() == "Content Too Large");
  CHECK(doc.at("status").as_int64() == 413);
  CHECK(doc.at("code").as_string() == "request_too_large");
  CHECK(doc.at("detail").as_string() == "the body exceeds 1024 bytes");
}

TEST_CASE("problem: version and keep-alive follow the arguments") {
  const auto res = make_problem(http::status::bad_request, "bad_request", "Bad Request", "x", 10,
                                false);
  CHECK(res.version() == 10);
  CHECK_FALSE(res.keep_alive());
  const auto res11 = make_problem(http::status::bad_request, "bad_request", "Bad Request", "x", 11,
                                  false);
  CHECK(res11[http::field::connection] == "close");
}

TEST_CASE("problem: details are escaped into valid JSON") {
  const std::string nasty = std::string("quote\" backslash\\ newline\n tab\t nul") + '\0' +
                            " ctl\x01 del\x7f utf8 \xc3\xa9 bad \xff\xfe end \xe2\x82";
  const auto res = make_problem(http::status::bad_request, "bad_request", "Bad \"Request\"", nasty);
  boost::json::value doc;
  REQUIRE_NOTHROW(doc = boost::json::parse(res.body()));
  const auto detail = std::string(doc.at("detail").as_string());
  CHECK(detail.find("quote\" backslash\\ newline\n tab\t nul") == 0);
  CHECK(detail.find(std::string("nul") + '\0') != std::string::npos);
  CHECK(detail.find("\xc3\xa9") != std::string::npos);                 // valid UTF-8 kept
  CHECK(detail.find("bad \xef\xbf\xbd\xef\xbf\xbd end") != std::string::npos);  // U+FFFD
  CHECK(doc.at("title").as_string() == "Bad \"Request\"");
}

TEST_CASE("problem: an empty title falls back to the reason phrase") {
  const auto res = make_problem(http::status::request_timeout, "request_timeout", "", "");
  const auto doc = boost::json::parse(res.body()).as_object();
  CHECK(doc.at("title").as_string() == "Request Timeout");
}

}  // namespace idem::server
