#pragma once
// What a link of the fault proxy (fault_proxy.cpp) does with the bytes between a client
// (a sidecar replica) and its target (PostgreSQL, the order API), and the control
// vocabulary that switches it at run time. Pure: parsed and rendered without sockets,
// unit-tested in chaos_test.cpp.
//
//   pass       bytes flow both ways
//   delay      every chunk waits delay_ms before it is forwarded (order kept)
//   blackhole  nothing flows, nothing is closed: bytes wait, as in a partition TCP survives;
//              new connections are accepted and wait too
//   reset      every open connection is reset (RST) now, and every new one at once
//   refuse     the listening socket is closed: new connections are refused (open ones
//              keep flowing, as when a server stops accepting)
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace idem::chaos {

enum class LinkKind { pass, delay, blackhole, reset, refuse };

struct LinkMode {
  LinkKind kind = LinkKind::pass;
  std::chrono::milliseconds delay{0};  // delay only

  bool operator==(const LinkMode&) const = default;
};

std::string_view link_kind_name(LinkKind kind);

// {"mode": "delay", "delay_ms": 200}; "delay_ms" only with "delay" (1..60000). The error
// text says what was wrong.
std::variant<LinkMode, std::string> parse_link_mode(std::string_view json);

// The same JSON form, for the control answers and the chaos history.
std::string render_link_mode(const LinkMode& mode);

}  // namespace idem::chaos
