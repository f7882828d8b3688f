#pragma once
// Helpers shared by the loader and the renderer of settings/. Not part of the component's
// interface (other components include settings.hpp only); exposed in a header so the unit
// tests can pin the syntax rules down one by one.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "settings/settings.hpp"

namespace idem::settings::detail {

// A rule violation found by a helper that does not know where in the file it is; the loader
// adds file, line and key and rethrows it as ConfigError.
struct SyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Looks an environment variable up; nullptr when unset. Injectable so tests need not touch
// the real environment.
using EnvLookup = std::function<const char*(const std::string& name)>;

// load_text with an injected environment, so tests need not setenv().
std::shared_ptr<const Settings> load_text(const std::string& yaml, const std::string& name,
                                          const EnvLookup& env, LoadOptions options = {});

// ${VAR}, ${VAR:-default} and $$ inside one scalar. Any other '$' stays literal, as in a
// shell, so a password such as "pa$word" needs no escaping. Throws SyntaxError.
std::string expand_env(std::string_view text, const EnvLookup& env);

// Same rules as parse_duration / parse_size, but the SyntaxError says what is wrong.
Millis duration_checked(std::string_view text);
std::size_t size_checked(std::string_view text);

// Renders durations and sizes in the largest unit that divides them exactly, so the
// rendered value parses back to the same number.
std::string format_duration(Millis d);
std::string format_size(std::size_t bytes);

// Strict decimal integer: optional '-', digits only, no spaces, no '+', no overflow.
std::optional<std::int64_t> parse_int(std::string_view text);

// RFC 9110 token (header field names and methods).
bool is_token(std::string_view s);
// RFC 6901 pointer: "" or '/'-separated segments whose '~' is followed by '0' or '1'.
bool is_json_pointer(std::string_view s);
// Where key.pointer may point: a JSON Pointer naming one member (not "", no "*" segment),
// or a form field path ("key", "meta[key]": a name and bracketed names, none empty).
bool is_key_pointer(std::string_view s);
// The JSON number grammar of RFC 8259, nothing more (no '+', no leading '.', no hex).
bool is_json_number(std::string_view s);

// "host:port" with IPv6 literals in brackets. Throws SyntaxError.
Endpoint parse_endpoint(std::string_view text);
// "host" or "host:port" (IPv6 literals in brackets, port 1..65535), as an authority is
// compared: the host in lower case, IPv6 in brackets, the port as written without leading
// zeros. Throws SyntaxError.
std::string parse_authority(std::string_view text);
// Brackets an IPv6 literal again, so the result parses back with parse_endpoint.
std::string format_endpoint(const Endpoint& e);

// Fills host, port and base_path from url (http only). Throws SyntaxError.
void parse_upstream_url(std::string_view url, UpstreamSettings& out);

// database.url as libpq reads it, without connecting (PQconninfoParse): nullopt when libpq
// accepts it, otherwise why not, in words that quote nothing of the value (any word of it
// may be, or be part of, the password).
std::optional<std::string> database_url_problem(const std::string& url);

// Route path: '/' followed by segments; a segment is either literal text or a whole
// "{name}" parameter. Throws SyntaxError.
void check_route_path(std::string_view path);
// The path with every parameter name erased ("/t/{tid}/o" -> "/t/{}/o"): two routes whose
// shapes are equal match the same requests, whatever their parameters are called.
std::string route_shape(std::string_view path);

// Canonical JSON string literal, quotes included (only '"', '\\' and control characters
// are escaped; other UTF-8 passes through unchanged).
std::string json_quote(std::string_view s);

}  // namespace idem::settings::detail
