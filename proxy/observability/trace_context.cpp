// W3C Trace Context parsing and formatting (trace_context.hpp says what is accepted).
#include "observability/trace_context.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>

namespace idem::obs {
namespace {

// Lowercase hex only: the Recommendation forbids uppercase in traceparent.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

template <std::size_t N>
bool parse_hex(std::string_view text, std::array<std::uint8_t, N>& out) {
  if (text.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_value(text[2 * i]);
    const int lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& a) {
  return std::all_of(a.begin(), a.end(), [](std::uint8_t b) { return b == 0; });
}

template <std::size_t N>
std::string hex(const std::array<std::uint8_t, N>& a) {
  // Sized once and written by index: appending digit by digit re-checked the capacity
  // for each of them, on every request (trace and span ids, traceparent).
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * N, '0');
  for (std::size_t i = 0; i < N; ++i) {
    out[2 * i] = kDigits[a[i] >> 4];
    out[2 * i + 1] = kDigits[a[i] & 0x0f];
  }
  return out;
}

bool lower_alpha(char c) { return c >= 'a' && c <= 'z'; }
bool digit(char c) { return c >= '0' && c <= '9'; }
// The characters after a key's first: lcalpha / DIGIT / "_" / "-" / "*" / "/".
bool key_char(char c) {
  return lower_alpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/';
}

// key = simple-key / multi-tenant-key
//   simple-key = lcalpha 0*255( keychar )
//   multi-tenant-key = tenant-id "@" system-id
//     tenant-id = ( lcalpha / DIGIT ) 0*240( keychar )
//     system-id = lcalpha 0*13( keychar )
bool valid_key(std::string_view k) {
  const auto at = k.find('@');
  if (at == std::string_view::npos) {
    return !k.empty() && k.size() <= 256 && lower_alpha(k[0]) &&
           std::all_of(k.begin() + 1, k.end(), key_char);
  }
  const auto tenant = k.substr(0, at);
  const auto system = k.substr(at + 1);
  return !tenant.empty() && tenant.size() <= 241 && (lower_alpha(tenant[0]) || digit(tenant[0])) &&
         std::all_of(tenant.begin() + 1, tenant.end(), key_char) && !system.empty() &&
         system.size() <= 14 && lower_alpha(system[0]) &&
         std::all_of(system.begin() + 1, system.end(), key_char);
}

// value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr = %x21-2B / %x2D-3C / %x3E-7E
bool valid_value(std::string_view v) {
  if (v.empty() || v.size() > 256 || v.back() == ' ') return false;
  return std::all_of(v.begin(), v.end(),
                     [](char c) { return c >= 0x20 && c <= 0x7e && c != ',' && c != '='; });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Trace and span ids need to be random, not secret (W3C Trace Context: unique, and random
// enough that ids from independent processes do not collide; nothing is authorized by
// one). A request makes several, and RAND_bytes costs about a microsecond a call in
// OpenSSL 3 (its DRBG runs AES-CTR behind a parameter lookup): 4 % of a replay's CPU in
// the profile. So each thread runs xoshiro256** (Blackman and Vigna), seeded once from
// RAND_bytes: 2^256 - 1 states, no thread shares a sequence.
class IdGenerator {
 public:
  IdGenerator() {
    do {
      if (RAND_bytes(reinterpret_cast<unsigned char*>(s_), sizeof s_) != 1) {
        throw std::runtime_error("RAND_bytes failed: no randomness to seed trace ids");
      }
    } while ((s_[0] | s_[1] | s_[2] | s_[3]) == 0);  // the one state it must not start in
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

template <std::size_t N>
std::array<std::uint8_t, N> random_nonzero() {
  static_assert(N % 8 == 0);
  thread_local IdGenerator gen;
  std::array<std::uint8_t, N> out{};
  do {
    for (std::size_t i = 0; i < N; i += 8) {
      const std::uint64_t v = gen.next();
      for (std::size_t b = 0; b < 8; ++b) out[i + b] = static_cast<std::uint8_t>(v >> (8 * b));
    }
  } while (all_zero(out));
  return out;
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view v) {
  // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
  constexpr std::size_t kLength = 55;
  if (v.size() < kLength || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  std::array<std::uint8_t, 1> version{};
  std::array<std::uint8_t, 1> flags{};
  TraceParent tp;
  if (!parse_hex(v.substr(0, 2), version) || version[0] == 0xff) return std::nullopt;
  if (!parse_hex(v.substr(3, 32), tp.trace_id) || !parse_hex(v.substr(36, 16), tp.parent_id) ||
      !parse_hex(v.substr(53, 2), flags)) {
    return std::nullopt;
  }
  if (all_zero(tp.trace_id) || all_zero(tp.parent_id)) return std::nullopt;
  // Version 00 has exactly these fields; a later version may add some after a dash.
  if (version[0] == 0 ? v.size() != kLength : (v.size() > kLength && v[kLength] != '-')) {
    return std::nullopt;
  }
  tp.version = version[0];
  tp.flags = flags[0];
  return tp;
}

std::optional<std::vector<std::string>> parse_tracestate(const std::vector<std::string_view>& fields) {
  constexpr std::size_t kMaxMembers = 32;
  std::vector<std::string> members;
  std::set<std::string_view, std::less<>> keys;
  for (auto field : fields) {
    while (true) {
      const auto comma = field.find(',');
      const auto member = trim_ows(field.substr(0, comma));
      if (!member.empty()) {
        const auto eq = member.find('=');
        if (eq == std::string_view::npos) return std::nullopt;
        const auto key = member.substr(0, eq);
        if (!valid_key(key) || !valid_value(member.substr(eq + 1))) return std::nullopt;
        if (!keys.insert(key).second || members.size() == kMaxMembers) return std::nullopt;
        members.emplace_back(member);
      }
      if (comma == std::string_view::npos) break;
      field.remove_prefix(comma + 1);
    }
  }
  return members;
}

std::string format_traceparent(const TraceId& trace, const SpanId& parent, std::uint8_t flags) {
  std::array<std::uint8_t, 1> f{flags};
  return "00-" + hex(trace) + "-" + hex(parent) + "-" + hex(f);
}

std::string format_tracestate(const std::vector<std::string>& members) {
  std::string out;
  for (const auto& m : members) {
    if (!out.empty()) out += ',';
    out += m;
  }
  return out;
}

std::string to_hex(const TraceId& id) { return hex(id); }
std::string to_hex(const SpanId& id) { return hex(id); }

TraceId new_trace_id() { return random_nonzero<16>(); }
SpanId new_span_id() { return random_nonzero<8>(); }

RequestTrace continue_trace(const std::vector<std::string_view>& traceparent,
                            const std::vector<std::string_view>& tracestate, bool sample_new) {
  RequestTrace t;
  t.server_span = new_span_id();
  std::optional<TraceParent> parent;
  if (traceparent.size() == 1) parent = parse_traceparent(traceparent.front());
  if (parent) {
    t.trace_id = parent->trace_id;
    t.client_parent = parent->parent_id;
    // Only the sampled bit is defined for version 00; other bits are not ours to pass on.
    t.flags = parent->flags & 0x01;
    if (auto state = parse_tracestate(tracestate)) t.tracestate = std::move(*state);
  } else {
    // No usable parent: a new trace, and the tracestate of another trace is meaningless.
    t.trace_id = new_trace_id();
    t.flags = sample_new ? 0x01 : 0x00;
  }
  return t;
}

}  // namespace idem::obs
