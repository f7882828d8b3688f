#pragma once
// The HTTP/1.1 message parser of the listener (requests) and of the upstream client
// (responses), in place of Beast's http::parser, for one reason: Beast 1.81 hands the fields
// of a chunked trailer section to the same callback as the header's, and http::parser
// appends them to the message's header fields, where nothing tells them apart from fields
// the sender put in the header. Every decision idemproxy takes (route, tenant, key,
// principal, fingerprint, what the backend receives) reads the header, so a trailer must
// never get there.
//
// Here trailer fields are counted and discarded (RFC 9110 §6.5.1 lets a recipient that
// removes the chunked coding discard them; idemproxy always forwards with Content-Length),
// and chunk extensions, which a recipient must ignore (RFC 9112 §7.1.1), are counted as
// well. Both draw on one budget per message, the metadata limit: past it the parse fails
// (header_limit for a trailer, bad_chunk_extension for extensions) and overflow() says
// which. The budget bounds what the parser is handed; the caller bounds what it buffers
// while a chunk line or the trailer section is still incomplete (see pending_overflow()).
//
// The body limit of a chunked message is counted here too, once per chunk, for a second
// reason: Beast 1.81 takes a chunk's size off its body limit before it parses the chunk's
// extensions, and parses them again from the start when they are still incomplete
// (need_more), taking the size off again each time. A chunk line whose extensions never
// end (an unterminated quoted-string) thus ran into body_limit after a number of reads
// that depended on how the bytes arrived (found by fuzz/request). body_limit() below
// hides Beast's: Beast keeps the limit for a Content-Length (checked once, against the
// header), this class counts chunk sizes once each, when the chunk line has been parsed.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/types.hpp"

namespace idem::http_parse {

enum class Overflow {
  none,
  chunk_extensions,  // the chunk extensions of the message, together, are over the budget
  trailer,           // the trailer section is over the budget
};

// What an incomplete piece of chunk metadata that outgrew its bound was: the bytes a chunked
// body parse left unconsumed start at a chunk line (possibly after the CRLF that ends the
// previous chunk's data). A line that is still open is a chunk-size line with its
// extensions; a complete "0" line means the parser is waiting for the end of the trailer.
inline Overflow pending_overflow(std::string_view pending) noexcept {
  if (pending.starts_with("\r\n")) pending.remove_prefix(2);
  const auto eol = pending.find('\n');
  if (eol == std::string_view::npos) return Overflow::chunk_extensions;
  std::size_t i = 0;
  while (i < eol && pending[i] == '0') ++i;
  const bool last_chunk = i > 0 && (i == eol || pending[i] == ';' || pending[i] == '\r' ||
                                    pending[i] == ' ' || pending[i] == '\t');
  return last_chunk ? Overflow::trailer : Overflow::chunk_extensions;
}

template <bool isRequest>
class MessageParser final : public http::basic_parser<isRequest> {
 public:
  using message_type = http::message<isRequest, http::string_body>;

  explicit MessageParser(std::size_t metadata_limit) noexcept : limit_(metadata_limit) {}

  message_type& get() noexcept { return m_; }
  const message_type& get() const noexcept { return m_; }
  message_type release() noexcept { return std::move(m_); }

  // In place of basic_parser::body_limit (see above); may be called before or after the
  // header is parsed, as basic_parser's may.
  void body_limit(boost::optional<std::uint64_t> v) noexcept {
    chunked_limit_ = v;
    base().body_limit(header_done_ && this->chunked() ? boost::none : v);
  }

  std::size_t metadata_limit() const noexcept { return limit_; }
  // Bytes of chunk extensions and trailer fields seen so far (names, values, separators).
  std::size_t metadata_bytes() const noexcept { return used_; }
  // Trailer fields received and discarded.
  std::size_t trailer_fields() const noexcept { return trailer_fields_; }
  Overflow overflow() const noexcept { return overflow_; }

 private:
  void on_request_impl(http::verb method, beast::string_view method_str,
                       beast::string_view target, int version, error_code&) override {
    if constexpr (isRequest) {
      if (method != http::verb::unknown) {
        m_.method(method);
      } else {
        m_.method_string(method_str);
      }
      m_.target(target);
      m_.version(static_cast<unsigned>(version));
    }
  }

  void on_response_impl(int code, beast::string_view reason, int version,
                        error_code&) override {
    if constexpr (!isRequest) {
      m_.result(static_cast<unsigned>(code));
      m_.reason(reason);
      m_.version(static_cast<unsigned>(version));
    }
  }

  void on_field_impl(http::field name, beast::string_view name_string, beast::string_view value,
                     error_code& ec) override {
    if (!header_done_) {
      m_.insert(name, name_string, value);
      return;
    }
    // A trailer field: counted, never stored.
    ++trailer_fields_;
    if (!spend(name_string.size() + value.size() + 4)) {  // "name: value\r\n"
      overflow_ = Overflow::trailer;
      ec = http::error::header_limit;
    }
  }

  void on_header_impl(error_code&) override {
    header_done_ = true;
    // Beast checked a Content-Length against its limit just before this call; the chunk
    // sizes of a chunked body are counted in on_chunk_header_impl instead.
    if (this->chunked()) base().body_limit(boost::none);
  }

  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         error_code&) override {
    // The length was checked against the body limit before any body byte was read.
    if (content_length) m_.body().reserve(static_cast<std::size_t>(*content_length));
  }

  std::size_t on_body_impl(beast::string_view body, error_code&) override {
    m_.body().append(body.data(), body.size());
    return body.size();
  }

  void on_chunk_header_impl(std::uint64_t size, beast::string_view extensions,
                            error_code& ec) override {
    if (chunked_limit_ && (chunked_body_ > *chunked_limit_ || size > *chunked_limit_ - chunked_body_)) {
      ec = http::error::body_limit;
      return;
    }
    chunked_body_ += size;
    if (!spend(extensions.size())) {
      overflow_ = Overflow::chunk_extensions;
      ec = http::error::bad_chunk_extension;
      return;
    }
    // Beast 1.81 checks the tokens of an extension but takes any byte inside a quoted
    // value, controls and NUL included, which RFC 9112 §7.1.1 (qdtext, quoted-pair) does
    // not allow: found by fuzz/response, on the request side as well. Outside quotes Beast
    // allows no control, and a line holds no CR or LF, so any control but HTAB, or DEL, is
    // one inside a quoted value.
    for (const char c : extensions) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7F) {
        ec = http::error::bad_chunk_extension;
        return;
      }
    }
  }

  std::size_t on_chunk_body_impl(std::uint64_t, beast::string_view body, error_code&) override {
    m_.body().append(body.data(), body.size());
    return body.size();
  }

  void on_finish_impl(error_code&) override {}

  http::basic_parser<isRequest>& base() noexcept { return *this; }

  bool spend(std::size_t n) noexcept {
    if (n > limit_ - used_) return false;
    used_ += n;
    return true;
  }

  message_type m_;
  const std::size_t limit_;
  std::size_t used_ = 0;
  std::size_t trailer_fields_ = 0;
  Overflow overflow_ = Overflow::none;
  bool header_done_ = false;
  // Beast's default limits (1 MiB for a request, 8 MiB for a response) until body_limit().
  boost::optional<std::uint64_t> chunked_limit_ = std::uint64_t{isRequest ? 1u << 20 : 8u << 20};
  std::uint64_t chunked_body_ = 0;  // chunk sizes seen so far
};

}  // namespace idem::http_parse
