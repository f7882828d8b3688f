// Fuzz target "request": the client side of a connection as the session reads it.
//
// Input: the bytes a client sends on one connection (possibly several pipelined requests).
// The harness replays proxy/server/server.cpp's read loop synchronously: Beast's
// request_parser with the session's header_limit / body_limit settings, inspect_framing on
// the parsed header, the 413 check on Content-Length, then the body, request after request
// while the connection stays open. MIRROR: keep run_session() in step with
// Session::run() in server.cpp when the session's parser configuration changes.
//
// Properties, for two sets of limits (the defaults and tiny ones):
//   1. Unambiguous: every request the sidecar accepts reads exactly the same under the
//      strict RFC 9112 reference (support/reference_http): same method, target, version,
//      field lines (names and values, header then trailer section), decoded body, and the
//      same end of message, so a backend that parses by the RFC cannot see a different
//      request, nor a different start of the next one (no smuggling).
//   2. Framing: inspect_framing refuses exactly what the documented policy refuses, computed
//      by the reference from its own reading of the fields; the accepted body respects
//      max_request_body.
//   3. Segmentation does not matter: delivering the bytes in small random pieces (as TCP
//      may) yields the same requests and the same way of ending the connection.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/server/framing.cpp
// (Beast's parser is covered too, but clang emits no line coverage for system headers:
// libFuzzer's cov/ft counts include it.)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/framing.hpp"
#include "support/check.hpp"
#include "support/reference_http.hpp"

namespace {

namespace http = boost::beast::http;
namespace asio = boost::asio;
using boost::system::error_code;
using idem::fuzz::printable;
namespace rh = idem::fuzz::ref_http;

// A SyncReadStream over the fuzz input that hands out pieces of a chosen size.
class PieceStream {
 public:
  PieceStream(std::string_view data, bool pieces) : data_(data), pieces_(pieces), rng_(0x5eed) {}

  template <class MutableBufferSequence>
  std::size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    if (pos_ == data_.size()) {
      ec = asio::error::eof;
      return 0;
    }
    std::size_t want = data_.size() - pos_;
    if (pieces_) want = std::min<std::size_t>(want, std::uniform_int_distribution<std::size_t>(1, 64)(rng_));
    const std::size_t n = asio::buffer_copy(buffers, asio::buffer(data_.data() + pos_, want));
    pos_ += n;
    ec = {};
    return n;
  }
  template <class MutableBufferSequence>
  std::size_t read_some(const MutableBufferSequence& buffers) {
    error_code ec;
    const std::size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  std::size_t delivered() const { return pos_; }

 private:
  std::string_view data_;
  bool pieces_;
  std::mt19937 rng_;
  std::size_t pos_ = 0;
};

struct Limits {
  std::size_t max_header_bytes;
  std::size_t max_request_body;
};

struct Accepted {
  std::string method, target;
  unsigned version = 0;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string body;
  idem::server::BodyFraming framing{};
  std::size_t header_end = 0;  // offset just past the header section
  std::size_t end = 0;         // offset just past the message
  bool operator==(const Accepted&) const = default;
};

struct Outcome {
  std::vector<Accepted> requests;
  std::string ended;  // how the connection ended
  // Set when the last header was parsed (whatever followed): for the framing property.
  bool header_parsed = false;
  idem::server::BodyFraming header_framing{};
  std::size_t header_start = 0, header_end = 0;
  // Segmentation may change which error Beast reports for a malformed header or body (once
  // a start line is incomplete, Beast waits for the end of the header before looking at it
  // again, so a bad method that arrived in pieces ends as "partial message"); either way
  // nothing is forwarded and the connection ends. The requests and the kind of ending must
  // not change.
  std::string ending_kind() const { return ended.substr(0, ended.find(':')); }
  bool operator==(const Outcome& o) const {
    return requests == o.requests && ending_kind() == o.ending_kind();
  }
};

std::string describe(const Outcome& o) {
  std::string s = std::to_string(o.requests.size()) + " request(s), ended: " + o.ended;
  for (const auto& r : o.requests) {
    s += "\n    " + printable(r.method) + " " + printable(r.target) + " body=" +
         std::to_string(r.body.size()) + " end=" + std::to_string(r.end);
  }
  return s;
}

// Session::run() in server.cpp, synchronously and without the handler. One function, step
// for step like the session's loop (idle read, header, framing, 413, body, keep-alive), so
// the two can be read side by side when either changes.
Outcome run_session(std::string_view input, const Limits& limits, bool pieces) {
  PieceStream stream(input, pieces);
  boost::beast::flat_buffer buffer;
  Outcome out;
  const auto consumed = [&] { return stream.delivered() - buffer.size(); };
  for (int n = 0; n < 16; ++n) {
    if (buffer.size() == 0) {  // idle: the first read of the next request
      error_code ec;
      const std::size_t got = stream.read_some(buffer.prepare(1024), ec);
      buffer.commit(got);
      if (ec) {
        out.ended = "idle eof";
        return out;
      }
    }
    const std::size_t start = consumed();
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
    parser.body_limit(boost::none);
    error_code hec;
    http::read_header(stream, buffer, parser, hec);
    if (hec) {
      out.ended = "header: " + hec.message();
      return out;
    }
    const std::size_t header_end = consumed();
    if (header_end - start > limits.max_header_bytes) {
      // OPEN FINDING (docs/fuzzing.md): when the whole header is in the buffer at once,
      // Beast applies header_limit to the start line and to the field section separately,
      // so a header of up to twice max_header_bytes passes, while the same bytes arriving in
      // pieces get 431. The session does not count the header's bytes itself yet. The
      // harness stops the connection here, as that check would, so the other properties
      // keep being checked; once server.cpp refuses such a header, this is its mirror.
      out.ended = "header: over max_header_bytes (the session still accepts it)";
      return out;
    }
    const idem::server::FramingCheck framing = idem::server::inspect_framing(parser.get());
    out.header_parsed = true;
    out.header_framing = framing.framing;
    out.header_start = start;
    out.header_end = header_end;
    IDEM_CHECK((framing.framing == idem::server::BodyFraming::invalid) == !framing.problem.empty(),
               "a refusal needs a reason, an acceptance none");
    if (framing.framing == idem::server::BodyFraming::invalid) {
      out.ended = "400 framing";
      return out;
    }
    if (framing.framing == idem::server::BodyFraming::length &&
        framing.length > limits.max_request_body) {
      out.ended = "413 content-length";
      return out;
    }
    if (!parser.is_done()) {
      parser.body_limit(limits.max_request_body);
      error_code bec;
      http::read(stream, buffer, parser, bec);
      if (bec) {
        out.ended = "body: " + bec.message();
        return out;
      }
    }
    out.header_parsed = false;
    const auto& req = parser.get();
    Accepted a;
    a.method = std::string(req.method_string());
    a.target = std::string(req.target());
    a.version = req.version();
    for (const auto& f : req) a.fields.emplace_back(std::string(f.name_string()), std::string(f.value()));
    a.body = req.body();
    a.framing = framing.framing;
    a.header_end = header_end;
    a.end = consumed();
    const bool keep_alive = req.keep_alive();
    out.requests.push_back(std::move(a));
    if (!keep_alive) {
      out.ended = "close";
      return out;
    }
  }
  out.ended = "request cap";
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return out;
}

std::string collapse_ws(std::string_view s) {
  std::string out;
  bool ws = false;
  for (const char c : s) {
    if (c == ' ' || c == '\t') {
      ws = true;
      continue;
    }
    if (ws && !out.empty()) out += ' ';
    ws = false;
    out += c;
  }
  return out;
}

idem::server::BodyFraming to_server(rh::Framing f) {
  switch (f) {
    case rh::Framing::none: return idem::server::BodyFraming::none;
    case rh::Framing::length: return idem::server::BodyFraming::length;
    case rh::Framing::chunked: return idem::server::BodyFraming::chunked;
    case rh::Framing::invalid: break;
  }
  return idem::server::BodyFraming::invalid;
}

void check_against_reference(std::string_view input, const Limits& limits, const Outcome& o) {
  std::size_t offset = 0;
  for (std::size_t i = 0; i < o.requests.size(); ++i) {
    const Accepted& a = o.requests[i];
    const std::string where = "request #" + std::to_string(i) + " at offset " + std::to_string(offset);
    const rh::Result ref = rh::parse_request(input, offset);
    IDEM_CHECK(ref.status == rh::Status::ok,
               where + ": accepted, but the strict reading says " +
                   (ref.status == rh::Status::incomplete ? "incomplete" : "invalid: " + ref.why));
    const rh::Request& r = ref.request;
    IDEM_CHECK(a.method == r.method, where + ": method " + printable(a.method) + " vs " + printable(r.method));
    IDEM_CHECK(a.target == r.target, where + ": target " + printable(a.target) + " vs " + printable(r.target));
    IDEM_CHECK(a.version == static_cast<unsigned>(r.version), where + ": version");
    std::vector<rh::Field> all = r.fields;
    all.insert(all.end(), r.trailers.begin(), r.trailers.end());
    // Beast keeps fields of one name together (a repeated field is inserted after the last
    // one of its name), which RFC 9110 §5.3 allows: only the order of same-name lines
    // matters. Compare both lists grouped by name, each group in its received order.
    auto fields = a.fields;
    std::stable_sort(fields.begin(), fields.end(),
                     [](const auto& x, const auto& y) { return lower(x.first) < lower(y.first); });
    std::stable_sort(all.begin(), all.end(),
                     [](const rh::Field& x, const rh::Field& y) { return lower(x.name) < lower(y.name); });
    IDEM_CHECK(fields.size() == all.size(), where + ": " + std::to_string(fields.size()) +
                                                " field lines vs " + std::to_string(all.size()));
    for (std::size_t k = 0; k < all.size(); ++k) {
      const auto& [name, value] = fields[k];
      IDEM_CHECK(name == all[k].name, where + ": field name " + printable(name) + " vs " + printable(all[k].name));
      // Beast and RFC 9112 §5.2 both replace an obs-fold by whitespace; only the amount of it
      // may differ.
      const bool same = all[k].folded ? collapse_ws(value) == collapse_ws(all[k].value) : value == all[k].value;
      IDEM_CHECK(same, where + ": value of " + printable(name) + ": " + printable(value) + " vs " +
                           printable(all[k].value));
    }
    IDEM_CHECK(to_server(r.framing) == a.framing, where + ": framing differs");
    IDEM_CHECK(a.body == r.body, where + ": body of " + std::to_string(a.body.size()) + " bytes vs " +
                                     std::to_string(r.body.size()));
    IDEM_CHECK(a.body.size() <= limits.max_request_body, where + ": body above max_request_body");
    IDEM_CHECK(a.header_end == ref.header_end, where + ": header ends at " + std::to_string(a.header_end) +
                                                   " vs " + std::to_string(ref.header_end));
    IDEM_CHECK(a.end == r.end, where + ": message ends at " + std::to_string(a.end) + " vs " +
                                   std::to_string(r.end));
    offset = a.end;
  }
  // The header that ended the connection (framing refused, 413, or a body error): what
  // inspect_framing decided must be what the policy decides on the strict reading.
  if (o.header_parsed) {
    const rh::Result ref = rh::parse_request(input, o.header_start);
    IDEM_CHECK(ref.header_complete, "header accepted by Beast, but the strict reading disagrees: " +
                                        (ref.status == rh::Status::invalid ? ref.why : std::string("incomplete")));
    IDEM_CHECK(ref.header_end == o.header_end, "header end differs");
    std::uint64_t length = 0;
    const rh::Framing f = rh::framing_of(ref.request.fields, ref.request.version, &length);
    IDEM_CHECK(to_server(f) == o.header_framing, "inspect_framing and the policy disagree");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  static constexpr Limits kLimits[] = {
      {16u << 10, 1u << 20},  // settings::Limits defaults
      {200, 16},              // tiny: the limit paths
  };
  for (const Limits& limits : kLimits) {
    const Outcome whole = run_session(input, limits, false);
    check_against_reference(input, limits, whole);
    const Outcome pieces = run_session(input, limits, true);
    IDEM_CHECK(whole == pieces, "segmentation changed the outcome:\n  whole:  " + describe(whole) +
                                    "\n  pieces: " + describe(pieces));
  }
  return 0;
}
