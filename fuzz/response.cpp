// Fuzz target "response": the backend's side of one pooled connection as the upstream
// client reads it.
//
// Input: byte 0 says which requests are HEAD (bit k for exchange k, k = 0..2); the rest is
// what the backend sends on one connection, in segments separated by "<<NEXT>>": segment k
// arrives once request k has been written (the last exchange releases every remaining
// segment). So a segment's bytes after a response are already there when the connection is
// checked before reuse, and bytes in the next segment arrive only after the next request,
// too late for any check: the case of issue 10's class 6 (a 204 whose body comes later).
// The harness replays Pool::Impl::read_response (proxy/upstream/pool.cpp) synchronously:
// the same parser setup, header read, check_header, body read and judge() from
// upstream/response.hpp, with the pool's buffer cap, and take_idle()'s check for bytes
// already waiting before a connection is reused. MIRROR: keep run_connection() in step
// with read_response() and take_idle().
//
// Properties, for two sets of limits (the defaults and tiny ones), each with the bytes as
// the reads ask for them and in random 1-64-byte pieces:
//   1. Unambiguous: every response the client accepts reads exactly the same under the
//      strict RFC 9112 reference (support/reference_http): status, reason, version, each
//      header field line byte for byte (what is recorded and replayed), the decoded body,
//      the interim responses skipped before it, and where it ends; trailer fields are never
//      among the header's. So what is recorded is what the backend sent, and the next
//      exchange starts where the backend's next response starts.
//   2. Bodiless: an answer to HEAD, a 204 or a 304 has no body and never leaves the
//      connection reusable; a 101 is refused; a 1xx is never the final answer.
//   3. Reusable only at a boundary both sides agree on: a connection left reusable ended
//      its response exactly at the last byte received, by Content-Length or chunked (not by
//      the close), with keep-alive as the reference reads the Connection field and version;
//      a connection with bytes waiting before the next request is never reused.
//   4. Limits: an accepted header, start line included, is at most max_header; its chunk
//      extensions and trailer fields are counted as the reference counts them and together
//      at most max_header; the body is at most max_body.
//   5. Segmentation does not matter: the responses accepted and the way the connection
//      ends (pooled, retired, or an exchange failed) are the same however the bytes
//      arrive. Which failure it is may differ (see Outcome::kind()).
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/upstream/response.cpp
// covers: proxy/common/message_parser.hpp
// covers: proxy/common/io_now.hpp
// (Beast's parser is covered too, but clang emits no line coverage for system headers:
// libFuzzer's cov/ft counts include it.)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include "common/io_now.hpp"
#include "support/check.hpp"
#include "support/reference_http.hpp"
#include "upstream/response.hpp"

namespace {

namespace http = boost::beast::http;
namespace asio = boost::asio;
namespace up = idem::upstream;
using boost::system::error_code;
using idem::fuzz::printable;
namespace rh = idem::fuzz::ref_http;
using rh::collapse_ws;
using rh::lower;

constexpr std::string_view kMarker = "<<NEXT>>";
constexpr int kMaxExchanges = 3;

// The backend's bytes on one connection: segments released one per request. At the end of
// what was released so far a read would block (the harness answers would_block: the pool
// would wait until its deadline); at the end of everything, EOF (the backend closed).
class BackendStream {
 public:
  BackendStream(std::string_view data, std::vector<std::size_t> ends, bool pieces)
      : data_(data), ends_(std::move(ends)), pieces_(pieces), rng_(0x5eed) {}

  // Request k was written: segment k arrives (and, for the last exchange, all the rest).
  void release(std::size_t k, bool last) {
    const std::size_t upto = last ? ends_.size() - 1 : std::min(k, ends_.size() - 1);
    available_ = std::max(available_, ends_[upto]);
    all_released_ = upto == ends_.size() - 1;
  }
  std::size_t waiting() const { return available_ - pos_; }  // arrived, not yet read
  std::size_t delivered() const { return pos_; }
  std::size_t segments() const { return ends_.size(); }

  template <class MutableBufferSequence>
  std::size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    if (pos_ == available_) {
      ec = all_released_ ? error_code(asio::error::eof) : error_code(asio::error::would_block);
      return 0;
    }
    std::size_t want = available_ - pos_;
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

 private:
  std::string_view data_;
  std::vector<std::size_t> ends_;  // offset just past each segment in data_
  bool pieces_;
  std::mt19937 rng_;
  std::size_t pos_ = 0;
  std::size_t available_ = 0;
  bool all_released_ = false;
};

using FieldLines = std::vector<std::pair<std::string, std::string>>;

struct Accepted {
  unsigned status = 0;
  std::string reason;
  unsigned version = 0;
  FieldLines fields;
  std::string body;
  int interims = 0;                // 1xx responses skipped before it
  std::size_t header_start = 0;    // offset of the final response's status line
  std::size_t header_end = 0;      // just past its header
  std::size_t end = 0;             // just past the message
  std::size_t metadata = 0;        // chunk extension and trailer bytes the parser counted
  std::size_t trailer_fields = 0;  // trailer fields it discarded
  // Not compared across segmentations: whether the stray bytes after a response were
  // already buffered depends on how they arrived (either way the connection is retired).
  bool reusable = false;
  std::size_t delivered = 0;  // bytes received when the response was complete
  bool operator==(const Accepted& o) const {
    return std::tie(status, reason, version, fields, body, interims, header_start, header_end, end, metadata,
                    trailer_fields) == std::tie(o.status, o.reason, o.version, o.fields, o.body, o.interims,
                                                o.header_start, o.header_end, o.end, o.metadata, o.trailer_fields);
  }
};

struct Outcome {
  std::vector<Accepted> responses;
  std::string ended;  // "pooled", "retired", "refused: ...", "broken: ...", "waiting"
  // Which failure ends an exchange may depend on segmentation: once a header is
  // incomplete, Beast waits for its end before it parses it again, so a malformed line
  // that arrived in pieces ends as a partial message at the backend's close (504) where
  // the same bytes at once are malformed (502). Either way nothing is answered from the
  // backend, the connection closes and the record's lease expires at once; the responses
  // accepted, and whether the connection is pooled, must not change.
  std::string kind() const {
    return ended == "pooled" || ended == "retired" ? ended : std::string("failed");
  }
  bool operator==(const Outcome& o) const { return responses == o.responses && kind() == o.kind(); }
};

std::string describe(const Outcome& o) {
  std::string s = std::to_string(o.responses.size()) + " response(s), ended: " + o.ended;
  for (const auto& r : o.responses) {
    s += "\n    " + std::to_string(r.status) + " body=" + std::to_string(r.body.size()) +
         " end=" + std::to_string(r.end) + (r.reusable ? " reusable" : "");
  }
  return s;
}

// A failed read as the pool reports it. would_block stands for the deadline: the backend
// sent nothing more, and has not closed.
std::string failed(const error_code& ec, up::Failure f) {
  if (ec == asio::error::would_block) return "waiting";
  const bool refused = f == up::Failure::response_too_large || f == up::Failure::bad_response;
  return std::string(refused ? "refused: " : "broken: ") + up::to_string(f) + (ec ? " " + ec.message() : "");
}

FieldLines field_lines(const http::fields& fields) {
  FieldLines out;
  for (const auto& f : fields) out.emplace_back(std::string(f.name_string()), std::string(f.value()));
  return out;
}

// What Pool::Impl::read_response and take_idle() in pool.cpp do with one connection's
// bytes, exchange after exchange, synchronously: phase for phase like the pool, so the two
// read side by side when either changes. Over ~80 lines for that reason.
Outcome run_connection(std::string_view data, const std::vector<std::size_t>& ends, std::uint8_t heads,
                       const up::ResponseLimits& limits, bool pieces) {
  BackendStream stream(data, ends, pieces);
  boost::beast::flat_buffer buffer;
  buffer.max_size(up::read_buffer_cap(limits));
  Outcome out;
  const auto consumed = [&] { return stream.delivered() - buffer.size(); };
  const int exchanges = static_cast<int>(std::min<std::size_t>(kMaxExchanges, stream.segments()));
  bool reusable = false;
  for (int k = 0; k < exchanges; ++k) {
    // take_idle(): a pooled connection with bytes waiting (or still buffered) is closed.
    if (k > 0 && (buffer.size() > 0 || stream.waiting() > 0)) {
      out.ended = "retired";
      return out;
    }
    stream.release(static_cast<std::size_t>(k), k == exchanges - 1);
    const bool head = (heads >> k) & 1;
    Accepted a;
    for (;;) {
      const std::size_t start = consumed();
      up::ResponseParser parser(limits.max_header);
      up::prepare_parser(parser, limits, head);
      error_code hec;
      std::size_t hn = 0;
      if (!idem::io_now::parse_buffered(parser, buffer, idem::io_now::HeaderDone{}, hec, hn)) {
        hn += http::read_header(stream, buffer, parser, hec);
      }
      const up::Failure hf = hec ? up::classify_read_error(hec) : up::check_header(parser, hn, limits, head);
      if (hec || hf != up::Failure::none) {
        out.ended = failed(hec, hf);
        return out;
      }
      IDEM_CHECK(hn == consumed() - start, "read_header's count is not the header's bytes");
      a.header_start = start;
      a.header_end = consumed();
      const FieldLines header = field_lines(parser.get());
      {
        error_code bec;
        parser.eager(true);
        std::size_t parsed = 0;
        if (!idem::io_now::parse_buffered(parser, buffer, idem::io_now::MessageDone{}, bec, parsed)) {
          http::read(stream, buffer, parser, bec);
        }
        if (bec) {
          out.ended = failed(bec, up::classify_read_error(bec));
          return out;
        }
      }
      const up::Verdict verdict = up::judge(parser, head, buffer.size());
      if (verdict.interim) {
        IDEM_CHECK(parser.get().body().empty(), "an interim response with a body");
        ++a.interims;
        continue;
      }
      if (verdict.failure != up::Failure::none) {
        out.ended = failed({}, verdict.failure);
        return out;
      }
      // Trailers never join the header.
      IDEM_CHECK(field_lines(parser.get()) == header,
                 "the header changed while the body was read (" + std::to_string(parser.trailer_fields()) +
                     " trailer fields)");
      a.status = parser.get().result_int();
      a.reason = std::string(parser.get().reason());
      a.version = parser.get().version();
      a.fields = header;
      a.body = parser.get().body();
      a.end = consumed();
      a.metadata = parser.metadata_bytes();
      a.trailer_fields = parser.trailer_fields();
      a.reusable = verdict.reusable;
      a.delivered = stream.delivered();
      reusable = verdict.reusable;
      break;
    }
    out.responses.push_back(std::move(a));
    if (!reusable) {
      out.ended = "retired";
      return out;
    }
  }
  // After the last exchange: pooled, unless take_idle() would find bytes waiting.
  out.ended = buffer.size() > 0 || stream.waiting() > 0 ? "retired" : "pooled";
  return out;
}

void check_against_reference(std::string_view data, std::uint8_t heads, const up::ResponseLimits& limits,
                             const Outcome& o) {
  std::size_t offset = 0;
  for (std::size_t k = 0; k < o.responses.size(); ++k) {
    const Accepted& a = o.responses[k];
    const bool head = (heads >> k) & 1;
    const std::string where = "exchange #" + std::to_string(k) + (head ? " (HEAD)" : "") + " at offset " +
                              std::to_string(offset);
    rh::ResponseResult ref;
    int interims = 0;
    for (;;) {
      ref = rh::parse_response(data, offset, head);
      IDEM_CHECK(ref.status == rh::Status::ok,
                 where + ": accepted, but the strict reading says " +
                     (ref.status == rh::Status::incomplete ? "incomplete" : "invalid: " + ref.why));
      const int status = ref.response.status;
      if (status / 100 != 1) break;
      IDEM_CHECK(status != 101, where + ": accepted after a 101");
      ++interims;
      offset = ref.response.end;
    }
    const rh::Response& r = ref.response;
    IDEM_CHECK(a.interims == interims, where + ": " + std::to_string(a.interims) + " interim responses vs " +
                                           std::to_string(interims));
    IDEM_CHECK(a.header_start == offset, where + ": the final response starts at " + std::to_string(a.header_start));
    IDEM_CHECK(a.status == static_cast<unsigned>(r.status),
               where + ": status " + std::to_string(a.status) + " vs " + std::to_string(r.status));
    // Beast's header stores an empty reason as "none" and then reports the status's usual
    // phrase ("OK"); clients ignore the phrase (RFC 9112 §4).
    IDEM_CHECK(a.reason == r.reason || r.reason.empty(),
               where + ": reason " + printable(a.reason) + " vs " + printable(r.reason));
    IDEM_CHECK(a.version == static_cast<unsigned>(r.version), where + ": version");
    // Beast keeps the lines of one field name together (RFC 9110 §5.3 makes only the order
    // of same-name lines significant): compare both grouped by name, in received order.
    auto fields = a.fields;
    std::vector<rh::Field> want = r.fields;
    std::stable_sort(fields.begin(), fields.end(),
                     [](const auto& x, const auto& y) { return lower(x.first) < lower(y.first); });
    std::stable_sort(want.begin(), want.end(),
                     [](const rh::Field& x, const rh::Field& y) { return lower(x.name) < lower(y.name); });
    IDEM_CHECK(fields.size() == want.size(), where + ": " + std::to_string(fields.size()) + " field lines vs " +
                                                 std::to_string(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& [name, value] = fields[i];
      IDEM_CHECK(name == want[i].name, where + ": field name " + printable(name) + " vs " + printable(want[i].name));
      // Recorded and replayed byte for byte: exact, except that an obs-fold becomes
      // whitespace (RFC 9112 §5.2), whose amount may differ.
      const bool same = want[i].folded ? collapse_ws(value) == collapse_ws(want[i].value) : value == want[i].value;
      IDEM_CHECK(same, where + ": value of " + printable(name) + ": " + printable(value) + " vs " +
                           printable(want[i].value));
    }
    IDEM_CHECK(a.body == r.body, where + ": body of " + std::to_string(a.body.size()) + " bytes vs " +
                                     std::to_string(r.body.size()));
    IDEM_CHECK(a.header_end == ref.header_end, where + ": header ends at " + std::to_string(a.header_end) +
                                                   " vs " + std::to_string(ref.header_end));
    IDEM_CHECK(a.end == r.end, where + ": message ends at " + std::to_string(a.end) + " vs " +
                                   std::to_string(r.end));
    // 2. Bodiless.
    const bool bodiless = head || r.status == 204 || r.status == 304;
    IDEM_CHECK(!bodiless || (a.body.empty() && !a.reusable), where + ": a bodiless answer with a body or reusable");
    // 3. Reusable only at an agreed boundary.
    if (a.reusable) {
      IDEM_CHECK(r.keep_alive, where + ": reusable, but the reference reads no keep-alive");
      IDEM_CHECK(r.framing == rh::ResponseFraming::length || r.framing == rh::ResponseFraming::chunked,
                 where + ": reusable after a response not delimited by its own framing");
      IDEM_CHECK(a.end == a.delivered, where + ": reusable with " + std::to_string(a.delivered - a.end) +
                                           " bytes received past the response");
    }
    // 4. Limits.
    IDEM_CHECK(ref.header_end - offset <= limits.max_header,
               where + ": a header of " + std::to_string(ref.header_end - offset) + " bytes accepted");
    IDEM_CHECK(a.body.size() <= limits.max_body, where + ": body above max_body");
    IDEM_CHECK(a.trailer_fields == r.trailers.size(), where + ": " + std::to_string(a.trailer_fields) +
                                                          " trailer fields vs " + std::to_string(r.trailers.size()));
    const bool folded = std::any_of(r.trailers.begin(), r.trailers.end(), [](const rh::Field& f) { return f.folded; });
    IDEM_CHECK(folded || a.metadata == r.extension_bytes + r.trailer_bytes,
               where + ": chunk metadata counted " + std::to_string(a.metadata) + " vs " +
                   std::to_string(r.extension_bytes) + " + " + std::to_string(r.trailer_bytes));
    IDEM_CHECK(a.metadata <= limits.max_header, where + ": chunk metadata over the budget accepted");
    offset = a.end;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t heads = data[0];
  // The stream without markers, and where each segment ends in it.
  const std::string_view raw(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string stream;
  std::vector<std::size_t> ends;
  for (std::size_t pos = 0;;) {
    const auto marker = raw.find(kMarker, pos);
    stream.append(raw.substr(pos, marker == std::string_view::npos ? raw.npos : marker - pos));
    ends.push_back(stream.size());
    if (marker == std::string_view::npos) break;
    pos = marker + kMarker.size();
  }
  static const up::ResponseLimits kLimits[] = {
      {},         // the pool's defaults (PoolOptions)
      {200, 16},  // tiny: the limit paths
  };
  for (const up::ResponseLimits& limits : kLimits) {
    const Outcome whole = run_connection(stream, ends, heads, limits, false);
    check_against_reference(stream, heads, limits, whole);
    const Outcome pieces = run_connection(stream, ends, heads, limits, true);
    check_against_reference(stream, heads, limits, pieces);
    IDEM_CHECK(whole == pieces, "segmentation changed the outcome:\n  whole:  " + describe(whole) +
                                    "\n  pieces: " + describe(pieces));
  }
  return 0;
}
