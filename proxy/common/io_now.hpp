#pragma once
// Reads and writes that finish without the event loop when they can.
//
// Asio 1.81 and Beast complete an operation that needed no waiting (a parse of bytes
// already buffered, a send the kernel took whole) by posting its completion through the
// event loop: one more pass of the loop before the coroutine goes on, and, with other work
// queued, one more epoll_wait(0) system call. A request that arrived in one read is parsed
// that way twice (header, body), a backend's answer once, and both writes of an exchange
// complete that way: at one connection, five of the six loop passes a pass-through request
// took (docs/performance.md, "Loop passes per request"). The helpers below do the same work
// at once, and leave the Beast or Asio operation to the caller only when there is something
// to wait for; from there on the operation continues exactly where these stopped.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include "common/types.hpp"

namespace idem::io_now {

// Feeds the bytes `buffer` holds to `parser` until `done(parser)`, as Beast's read
// operations begin. true: `done` holds, or the parse failed (`ec`); false: the parser needs
// bytes that have not arrived (`ec` clear), and the caller starts Beast's read, which
// resumes this parse. `used` grows by the bytes consumed, which Beast's read would have
// reported. Callers that read a whole message set the parser eager first, as Beast's
// http::async_read does.
template <bool isRequest, class DynamicBuffer, class Done>
bool parse_buffered(http::basic_parser<isRequest>& parser, DynamicBuffer& buffer, Done done,
                    error_code& ec, std::size_t& used) {
  ec = {};
  while (!done(parser)) {
    if (buffer.size() == 0) return false;
    const std::size_t n = parser.put(buffer.data(), ec);
    used += n;
    buffer.consume(n);
    if (ec == http::error::need_more) {
      ec = {};
      return false;
    }
    if (ec) return true;
    // Nothing consumed and nothing wrong: what remains is for Beast's read to decide
    // (it may need an end of stream); never spin here.
    if (n == 0) return false;
  }
  return true;
}

// The two conditions of Beast's reads: http::async_read_header's and http::async_read's.
struct HeaderDone {
  template <class Parser>
  bool operator()(const Parser& p) const { return p.is_header_done(); }
};
struct MessageDone {
  template <class Parser>
  bool operator()(const Parser& p) const { return p.is_done(); }
};

// Sends as much of `buffers` (at most 2) as the kernel takes without waiting, on a plain
// TCP socket's descriptor. Returns the bytes sent; `ec` is set only for a failure that an
// asynchronous write would have reported too (a reset, a broken pipe), never for a full
// send buffer. The caller writes what is left with an Asio write.
inline std::size_t send_now(int fd, const std::array<asio::const_buffer, 2>& buffers,
                            error_code& ec) {
  ec = {};
  std::array<iovec, 2> iov{};
  std::size_t count = 0;
  for (const auto& b : buffers) {
    if (b.size() == 0) continue;
    iov[count].iov_base = const_cast<void*>(b.data());
    iov[count].iov_len = b.size();
    ++count;
  }
  if (count == 0) return 0;
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = count;
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    ec = error_code(errno, asio::error::get_system_category());
    return 0;
  }
}

// What is left of `buffers` after the first `sent` bytes.
inline std::array<asio::const_buffer, 2> after(const std::array<asio::const_buffer, 2>& buffers,
                                               std::size_t sent) {
  std::array<asio::const_buffer, 2> rest = buffers;
  for (auto& b : rest) {
    const std::size_t skip = std::min(sent, b.size());
    b += skip;
    sent -= skip;
  }
  return rest;
}

}  // namespace idem::io_now
