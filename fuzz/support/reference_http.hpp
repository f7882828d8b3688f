#pragma once
// A strict, independent reading of one HTTP/1.1 request or response (RFC 9112) from raw
// bytes: where it ends, what its fields are and how its body is framed. The request target
// compares Beast's parser plus server::inspect_framing against it: whatever the sidecar
// accepts must read the same way here, so a backend that parses by the RFC cannot see a
// different request (the definition of "unambiguous" the harness checks). The response
// target does the same for the upstream client's reading of backend responses. Slow and
// simple on purpose.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idem::fuzz::ref_http {

struct Field {
  std::string name;
  std::string value;    // OWS-trimmed; obs-folds replaced by one SP each
  bool folded = false;  // the value had an obs-fold (RFC 9112 §5.2)
};

enum class Framing { none, length, chunked, invalid };

struct Request {
  std::string method;
  std::string target;
  int version = 0;  // 10 or 11
  std::vector<Field> fields;    // header section, in order
  std::vector<Field> trailers;  // trailer section of a chunked body, in order
  Framing framing = Framing::none;
  std::uint64_t length = 0;  // framing == length
  std::string body;          // decoded (de-chunked) content
  // Chunk metadata, as the listener budgets it (common/message_parser.hpp): the bytes of
  // every chunk's extensions (after the size, before the CRLF), and of the trailer fields
  // counted as name + value + 4 ("name: value\r\n" with the value OWS-trimmed).
  std::size_t extension_bytes = 0;
  std::size_t trailer_bytes = 0;
  std::size_t end = 0;       // offset just past the message
};

enum class Status {
  ok,          // one complete, valid request
  incomplete,  // valid so far, but the input ends before the message does
  invalid,     // violates RFC 9112 (or the sidecar's stricter framing policy)
};

struct Result {
  Status status = Status::invalid;
  Request request;        // complete when ok; the header part may be filled otherwise
  std::string why;        // for invalid: which rule
  bool header_complete = false;
  std::size_t header_end = 0;  // offset just past the header section's empty line
};

// Parses the request starting at `offset` in `input`.
Result parse_request(std::string_view input, std::size_t offset);

// The framing rule the sidecar promises (docs/http.md): CL and TE together, several CL
// fields, a CL that is not 1*DIGIT, several TE fields, TE in HTTP/1.0 and any TE other than
// exactly "chunked" are invalid. Computed from `fields` alone.
Framing framing_of(const std::vector<Field>& fields, int version, std::uint64_t* length);

// ---------------------------------------------------------------------------- responses

// How a response's body is delimited (RFC 9112 §6.3): none for a 1xx, 204, 304 or an answer
// to HEAD; by Content-Length; chunked; or by the close of the connection.
enum class ResponseFraming { none, length, chunked, close, invalid };

struct Response {
  int version = 0;  // 10 * major + minor
  int status = 0;
  std::string reason;
  std::vector<Field> fields;    // header section, in order
  std::vector<Field> trailers;  // trailer section of a chunked body
  ResponseFraming framing = ResponseFraming::none;
  std::uint64_t length = 0;
  std::string body;  // decoded
  std::size_t extension_bytes = 0;  // counted as for requests (above)
  std::size_t trailer_bytes = 0;
  // RFC 9112 §9.3: no "close" option in any Connection field, and HTTP/1.1 or later, or
  // HTTP/1.0 with a "keep-alive" option.
  bool keep_alive = false;
  std::size_t end = 0;  // offset just past the message
};

struct ResponseResult {
  Status status = Status::invalid;
  Response response;
  std::string why;
  bool header_complete = false;
  std::size_t header_end = 0;
};

// Parses the response starting at `offset`, to a request that was HEAD or not. A body
// delimited by the close runs to the end of `input`, which is taken as the close.
ResponseResult parse_response(std::string_view input, std::size_t offset, bool head);

// The framing the upstream client accepts (proxy/upstream/response.hpp), computed from the
// fields alone: a bodiless status or HEAD: none, whatever the fields; Transfer-Encoding
// together with Content-Length, in several fields, in HTTP/1.0 or other than exactly
// "chunked": invalid; Content-Length fields whose values (each a list, RFC 9110 §8.6 and
// §5.6.1) are all one 1*DIGIT number: length; malformed or differing values: invalid;
// neither field: close.
ResponseFraming response_framing_of(const std::vector<Field>& fields, int version, int status,
                                    bool head, std::uint64_t* length);

// For comparing fields with the implementation's: ASCII lower case (field names), and runs
// of SP/HTAB as one SP with none leading (a folded value, as obs-fold reads).
std::string lower(std::string_view s);
std::string collapse_ws(std::string_view s);

}  // namespace idem::fuzz::ref_http
