#include "test_support/problem.hpp"

#include <doctest/doctest.h>

#include <boost/json.hpp>

namespace idem::test {

std::string problem_code(int status, std::string_view content_type, std::string_view body) {
  if (content_type != "application/problem+json") return {};
  boost::system::error_code ec;
  const auto v = boost::json::parse(body, ec);
  REQUIRE_MESSAGE((!ec && v.is_object()), "a problem body that is not a JSON object: " << body);
  const auto& o = v.as_object();
  CHECK(o.contains("type"));
  CHECK(o.contains("title"));
  CHECK(o.at("status").as_int64() == status);
  const auto* code = o.if_contains("code");
  REQUIRE_MESSAGE((code && code->is_string()), "a problem without a code: " << body);
  return std::string(code->as_string());
}

std::string problem_code(const HttpResponse& res) {
  return problem_code(res.status, res.header("Content-Type").value_or(""), res.body);
}

std::string problem_code(const boost::beast::http::response<boost::beast::http::string_body>& res) {
  const auto type = res[boost::beast::http::field::content_type];
  return problem_code(static_cast<int>(res.result_int()), std::string_view(type.data(), type.size()),
                      res.body());
}

}  // namespace idem::test
