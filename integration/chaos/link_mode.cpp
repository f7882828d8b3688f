#include "link_mode.hpp"

#include <array>
#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

namespace idem::chaos {

namespace json = boost::json;

namespace {

constexpr std::array<std::pair<LinkKind, std::string_view>, 5> kNames{{
    {LinkKind::pass, "pass"},
    {LinkKind::delay, "delay"},
    {LinkKind::blackhole, "blackhole"},
    {LinkKind::reset, "reset"},
    {LinkKind::refuse, "refuse"},
}};

constexpr std::int64_t kMaxDelayMs = 60'000;

}  // namespace

std::string_view link_kind_name(LinkKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::variant<LinkMode, std::string> parse_link_mode(std::string_view text) {
  boost::system::error_code ec;
  const json::value doc = json::parse(text, ec);
  if (ec || !doc.is_object()) return std::string("expected a JSON object");
  const json::object& o = doc.get_object();
  for (const auto& member : o) {
    if (member.key() != "mode" && member.key() != "delay_ms") {
      return "unknown member '" + std::string(member.key()) + "'";
    }
  }
  const auto* mode = o.if_contains("mode");
  if (mode == nullptr || !mode->is_string()) {
    return std::string("\"mode\" must be one of pass, delay, blackhole, reset, refuse");
  }
  LinkMode out;
  bool known = false;
  for (const auto& [kind, name] : kNames) {
    if (mode->get_string() == name) {
      out.kind = kind;
      known = true;
    }
  }
  if (!known) return "unknown mode '" + std::string(mode->get_string()) + "'";

  const auto* delay = o.if_contains("delay_ms");
  if (out.kind == LinkKind::delay) {
    if (delay == nullptr || !delay->is_int64() || delay->get_int64() < 1 ||
        delay->get_int64() > kMaxDelayMs) {
      return std::string("\"delay\" needs \"delay_ms\" from 1 to 60000");
    }
    out.delay = std::chrono::milliseconds(delay->get_int64());
  } else if (delay != nullptr) {
    return std::string("\"delay_ms\" belongs to mode \"delay\" only");
  }
  return out;
}

std::string render_link_mode(const LinkMode& mode) {
  json::object o{{"mode", link_kind_name(mode.kind)}};
  if (mode.kind == LinkKind::delay) o["delay_ms"] = mode.delay.count();
  return json::serialize(o);
}

}  // namespace idem::chaos
