#pragma once
// The vocabulary every demo service shares: message types, header access, the JSON and
// problem+json (RFC 9457) answers, and the small parsers the command lines need.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "common/types.hpp"

namespace idem::demo {

namespace json = boost::json;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// The value of a header that must appear at most once: nullopt when absent. A repeated
// header is reported through `repeated` (when given) so callers can refuse it instead of
// silently picking one of two values an intermediary may have read differently.
std::optional<std::string_view> single_header(const Request& req, std::string_view name,
                                              bool* repeated = nullptr);

// 1..max_length visible ASCII characters (0x21-0x7E): tenants, keys, ids from headers.
bool is_token(std::string_view text, std::size_t max_length);

// A UUID in canonical text form (8-4-4-4-12 hex digits, either case).
bool is_uuid(std::string_view text);

// A JSON answer. Serialized once, here, so equal values always produce equal bytes.
Response json_response(const Request& req, http::status status, const json::value& body);

// An application/problem+json answer: type "urn:idem-order-demo:problem:<code>", title,
// status, code (stable: clients match on it), detail (for humans), plus `extra` members.
Response problem(const Request& req, http::status status, std::string_view code,
                 std::string_view title, std::string_view detail, json::object extra = {});

// Decimal integer, the whole string, no sign unless `allow_negative`.
std::optional<std::int64_t> parse_int(std::string_view text, bool allow_negative = false);

// "250ms", "5s", "2m", "24h", "7d" (the sidecar's notation); a bare number is refused so
// that "30" never silently means 30 ms to one reader and 30 s to another.
std::optional<Millis> parse_duration(std::string_view text);

// "http://host:port" with an optional path prefix and no query, user info or TLS: the
// services talk plain HTTP on a private network (or loopback in the demo).
struct HttpUrl {
  std::string host;
  std::uint16_t port = 80;
  std::string path_prefix;  // "" or "/prefix" without a trailing slash
};
std::optional<HttpUrl> parse_http_url(std::string_view text);

}  // namespace idem::demo
