#pragma once
// Reading the RFC 9457 problem documents (application/problem+json) the sidecar and the
// reference backend answer with, for unit tests (Beast responses) and end-to-end tests
// (HttpResponse) alike.
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "test_support/http.hpp"

namespace idem::test {

// The problem's `code`, or "" when the response is not application/problem+json (a
// backend's own answer). A problem document must also have a type and a title and repeat
// the response's status: doctest CHECKs say so when it does not.
std::string problem_code(int status, std::string_view content_type, std::string_view body);

std::string problem_code(const HttpResponse& res);
std::string problem_code(const boost::beast::http::response<boost::beast::http::string_body>& res);

}  // namespace idem::test
