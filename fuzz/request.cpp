// Fuzz target "request": the client side of a connection as the session reads it.
//
// Input: the bytes a client sends on one connection (possibly several pipelined requests).
// The harness replays proxy/server/server.cpp's read loop (Session::serve()) synchronously:
// the listener's MessageParser (common/message_parser.hpp) with the session's header, body
// and metadata limits, the whole-header byte count, inspect_framing, prepare_request_head
// (Host rules, target normalization, Connection), the 413 check on Content-Length, then the
// body with the session's buffer cap, request after request while the connection stays
// open. MIRROR: keep run_session() in step with Session::serve() when the session's reads
// change.
//
// Properties, for two sets of limits (the defaults and tiny ones):
//   1. Unambiguous: every request the sidecar accepts reads exactly the same under the
//      strict RFC 9112 reference (support/reference_http): same method, target, version,
//      header field lines (names and values; trailer fields are never among them, and the
//      header is the same after the body as before it), decoded body, and the
//      same end of message, so a backend that parses by the RFC cannot see a different
//      request, nor a different start of the next one (no smuggling).
//   2. Framing: inspect_framing refuses exactly what the documented policy refuses, computed
//      by the reference from its own reading of the fields; the accepted body respects
//      max_request_body.
//   3. Segmentation does not matter: delivering the bytes in small random pieces (as TCP
//      may) yields the same requests and the same way of ending the connection.
//   4. Limits: an accepted header, start line included, is at most max_header_bytes; its
//      chunk extensions and trailer fields are counted as the reference counts them and
//      together at most max_header_bytes; every trailer field is counted and discarded.
//   5. Host: an accepted request has exactly one Host field (HTTP/1.1) or at most one
//      (HTTP/1.0), by the reference's reading of the header.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/server/framing.cpp
// covers: proxy/server/request_head.cpp
// covers: proxy/common/message_parser.hpp
// covers: proxy/common/io_now.hpp
// (Beast's parser is covered too, but clang emits no line coverage for system headers:
// libFuzzer's cov/ft counts include it.)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/io_now.hpp"
#include "common/message_parser.hpp"
#include "server/framing.hpp"
#include "server/request_head.hpp"
#include "support/check.hpp"
#include "support/reference_http.hpp"

namespace {

namespace http = boost::beast::http;
namespace asio = boost::asio;
using boost::system::error_code;
using idem::fuzz::printable;
namespace rh = idem::fuzz::ref_http;
using rh::collapse_ws;
using rh::lower;

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

// MIRROR: server.cpp's read sizes.
constexpr std::size_t kIdleReadSize = 1024;
constexpr std::size_t kChunkLineSlack = 256;

using FieldLines = std::vector<std::pair<std::string, std::string>>;

FieldLines field_lines(const http::fields& fields) {
  FieldLines out;
  for (const auto& f : fields) out.emplace_back(std::string(f.name_string()), std::string(f.value()));
  return out;
}

struct Accepted {
  std::string method, target;
  unsigned version = 0;
  FieldLines fields;  // as parsed, before the head rules
  std::string body;
  std::size_t metadata = 0;        // chunk extension and trailer bytes the parser counted
  std::size_t trailer_fields = 0;  // trailer fields it discarded
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
  // One exception, explained by the session's buffer cap on unfinished chunk metadata,
  // which only bites when the bytes arrive in pieces: a chunk line that never ends within
  // the input is refused for the budget in pieces, and is still waiting for its end when
  // the input (the connection) ends if it all came at once. Nothing is forwarded either way.
  static bool cap_vs_eof(const std::string& whole, const std::string& pieces) {
    return whole == "body, no answer: partial message" && pieces.starts_with("body refused:") &&
           pieces.ends_with("(metadata budget)");
  }
  // A second one from the same cap (found in the fifth session's runs): a chunk line whose
  // size is over the body limit and whose extension runs past the cap is answered 413 when
  // it all came at once (Beast reads the whole line, then checks the size), and refused for
  // the budget in pieces (the cap fills before the line ends). Both refuse the body and
  // close; nothing is forwarded.
  static bool cap_vs_limit(const std::string& whole, const std::string& pieces) {
    return whole == "body 413" && pieces == "body refused: 400 (metadata budget)";
  }
  bool operator==(const Outcome& o) const {
    return requests == o.requests &&
           (ending_kind() == o.ending_kind() || cap_vs_eof(ended, o.ended) || cap_vs_eof(o.ended, ended) ||
            cap_vs_limit(ended, o.ended));
  }
};

// Session::refuse_body()'s order: the body limit, the metadata budget (or the buffer cap
// on an unfinished chunk line or trailer), anything else.
std::string body_refusal(const error_code& ec, const idem::http_parse::MessageParser<true>& parser,
                         const boost::beast::flat_buffer& buffer) {
  auto overflow = parser.overflow();
  if (ec == http::error::buffer_overflow) {
    const auto pending = buffer.cdata();
    overflow = idem::http_parse::pending_overflow(
        std::string_view(static_cast<const char*>(pending.data()), pending.size()));
  }
  // The kind (before ':') is what the client is answered: a refusal (400 or 431), 413, or
  // nothing. Which refusal it is may depend on segmentation: unfinished chunk metadata
  // that arrives in pieces can fill the buffer cap before Beast sees its end, and is then
  // refused for the budget (as a trailer once the last-chunk line is complete), while the
  // same bytes at once are refused as malformed. Nothing is forwarded either way.
  if (ec == http::error::body_limit) return "body 413";
  if (overflow == idem::http_parse::Overflow::trailer) return "body refused: 431 (metadata budget)";
  if (overflow == idem::http_parse::Overflow::chunk_extensions) return "body refused: 400 (metadata budget)";
  const bool malformed = ec.category() == make_error_code(http::error::bad_chunk).category() &&
                         ec != http::error::end_of_stream && ec != http::error::partial_message;
  return std::string(malformed ? "body refused: 400 " : "body, no answer: ") + ec.message();  // MIRROR: is_malformed()
}

std::string describe(const Outcome& o) {
  std::string s = std::to_string(o.requests.size()) + " request(s), ended: " + o.ended;
  for (const auto& r : o.requests) {
    s += "\n    " + printable(r.method) + " " + printable(r.target) + " body=" +
         std::to_string(r.body.size()) + " end=" + std::to_string(r.end);
  }
  return s;
}

// What Session::serve() in server.cpp does with one connection's bytes, synchronously and
// without the handler: one function, phase for phase like the session (idle read, head:
// header, framing and head rules, 413; body; keep-alive), so the two read side by side
// when either changes. Over ~80 lines for that reason.
Outcome run_session(std::string_view input, const Limits& limits, bool pieces) {
  PieceStream stream(input, pieces);
  boost::beast::flat_buffer buffer;
  Outcome out;
  const auto consumed = [&] { return stream.delivered() - buffer.size(); };
  for (int n = 0; n < 16; ++n) {
    if (buffer.size() == 0) {  // wait_for_request(): the first read of the next request
      error_code ec;
      const std::size_t got = stream.read_some(buffer.prepare(kIdleReadSize), ec);
      buffer.commit(got);
      if (ec) {
        out.ended = "idle eof";
        return out;
      }
    }
    // read_head()
    const std::size_t start = consumed();
    idem::http_parse::MessageParser<true> parser(limits.max_header_bytes);
    parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
    parser.body_limit(boost::none);
    error_code hec;
    std::size_t hn = 0;
    if (!idem::io_now::parse_buffered(parser, buffer, idem::io_now::HeaderDone{}, hec, hn)) {
      hn += http::read_header(stream, buffer, parser, hec);
    }
    // A header refusal is one kind of ending: 431 or 400, which one Beast reports may depend
    // on segmentation (it waits for the end of the header before it parses a field that
    // arrived in pieces).
    if (hec == http::error::header_limit || (!hec && hn > limits.max_header_bytes)) {
      out.ended = "header: 431";
      return out;
    }
    if (hec) {
      out.ended = "header: " + hec.message();
      return out;
    }
    const std::size_t header_end = consumed();
    IDEM_CHECK(hn == header_end - start, "read_header's count is not the header's bytes");
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
    // The request as parsed, for the comparison with the reference (the head rules below
    // rewrite the target and Host).
    Accepted a;
    a.method = std::string(parser.get().method_string());
    a.target = std::string(parser.get().target());
    a.version = parser.get().version();
    a.fields = field_lines(parser.get());
    if (!idem::server::prepare_request_head(parser.get(), true).ok) {
      out.ended = "400 head";
      return out;
    }
    const FieldLines prepared = field_lines(parser.get());
    if (framing.framing == idem::server::BodyFraming::length &&
        framing.length > limits.max_request_body) {
      out.ended = "413 content-length";
      return out;
    }
    // read_body()
    if (!parser.is_done()) {
      parser.body_limit(limits.max_request_body);
      buffer.max_size(std::max(buffer.size(), limits.max_header_bytes + kChunkLineSlack));
      error_code bec;
      parser.eager(true);
      std::size_t parsed = 0;
      if (!idem::io_now::parse_buffered(parser, buffer, idem::io_now::MessageDone{}, bec, parsed)) {
        http::read(stream, buffer, parser, bec);
      }
      buffer.max_size(std::numeric_limits<std::size_t>::max());
      if (bec) {
        out.ended = body_refusal(bec, parser, buffer);
        return out;
      }
    }
    out.header_parsed = false;
    // Trailers never join the header: after the body it is the one the head rules left.
    IDEM_CHECK(field_lines(parser.get()) == prepared,
               "the header changed while the body was read (" + std::to_string(parser.trailer_fields()) +
                   " trailer fields)");
    a.body = parser.get().body();
    a.framing = framing.framing;
    a.header_end = header_end;
    a.end = consumed();
    a.metadata = parser.metadata_bytes();
    a.trailer_fields = parser.trailer_fields();
    const bool keep_alive = parser.get().keep_alive();
    out.requests.push_back(std::move(a));
    if (!keep_alive) {
      out.ended = "close";
      return out;
    }
  }
  out.ended = "request cap";
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
    std::vector<rh::Field> all = r.fields;  // the header section only: trailers are discarded
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
    // Trailers and extensions: discarded, but counted against the budget as the reference
    // counts them.
    IDEM_CHECK(a.trailer_fields == r.trailers.size(), where + ": " + std::to_string(a.trailer_fields) +
                                                          " trailer fields vs " + std::to_string(r.trailers.size()));
    const bool folded = std::any_of(r.trailers.begin(), r.trailers.end(), [](const rh::Field& f) { return f.folded; });
    IDEM_CHECK(folded || a.metadata == r.extension_bytes + r.trailer_bytes,
               where + ": chunk metadata counted " + std::to_string(a.metadata) + " vs " +
                   std::to_string(r.extension_bytes) + " + " + std::to_string(r.trailer_bytes));
    IDEM_CHECK(a.metadata <= limits.max_header_bytes, where + ": chunk metadata over the budget accepted");
    // RFC 9112 §3.2: exactly one Host in HTTP/1.1, at most one in HTTP/1.0.
    const auto hosts = std::count_if(r.fields.begin(), r.fields.end(),
                                     [](const rh::Field& f) { return lower(f.name) == "host"; });
    IDEM_CHECK(hosts == 1 || (hosts == 0 && r.version == 10),
               where + ": accepted with " + std::to_string(hosts) + " Host fields");
    IDEM_CHECK(a.body == r.body, where + ": body of " + std::to_string(a.body.size()) + " bytes vs " +
                                     std::to_string(r.body.size()));
    IDEM_CHECK(a.body.size() <= limits.max_request_body, where + ": body above max_request_body");
    IDEM_CHECK(ref.header_end - offset <= limits.max_header_bytes,
               where + ": a header of " + std::to_string(ref.header_end - offset) + " bytes accepted");
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
