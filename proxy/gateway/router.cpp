#include "gateway/router.hpp"

#include "gateway/headers.hpp"
#include "gateway/policy.hpp"

#include <algorithm>
#include <stdexcept>

namespace idem::gateway {
namespace {

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  std::size_t start = 0;
  // A leading '/' is required by config validation and by HTTP origin-form targets.
  if (!path.empty() && path.front() == '/') start = 1;
  while (true) {
    const auto slash = path.find('/', start);
    out.emplace_back(path.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return out;
}

bool is_placeholder(std::string_view seg) {
  return seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
}

constexpr std::string_view kAnySegment = "{}";

void add_decided(std::vector<std::string>& out, const std::string& name) {
  if (name.empty()) return;
  for (const auto& have : out) {
    if (iequals(have, name)) return;
  }
  out.push_back(name);
}

}  // namespace

std::vector<std::string> loose_segments(std::string_view path) {
  std::string text;
  text.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    char c = path[i];
    if (const int byte = idem::text::percent_byte(path, i); byte >= 0) {
      c = static_cast<char>(byte);
      i += 2;
    }
    if (c == '\\') c = '/';
    c = idem::text::ascii_lower(c);
    text.push_back(c);
  }
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find('/', start);
    if (end == std::string::npos) end = text.size();
    std::string_view seg(text.data() + start, end - start);
    seg = seg.substr(0, seg.find(';'));
    while (!seg.empty() && (seg.back() == '.' || seg.back() == ' ')) {
      if (seg == "." || seg == "..") break;
      seg.remove_suffix(1);
    }
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
    } else if (!seg.empty() && seg != ".") {
      out.emplace_back(seg);
    }
    start = end + 1;
  }
  return out;
}

namespace {

// tenant.from: jwt | mtls. In jwt mode the token is decided by as well: its look-alikes
// go and a Connection option may not name it (gateway/inbound.hpp).
void build_identity(const settings::Settings& s, std::shared_ptr<const identity::Resolver>& out,
                    std::vector<std::string>& decided) {
  const auto& tenant = s.tenant;
  if (tenant.from == settings::TenantSource::header) return;
  std::shared_ptr<const identity::KeySet> keys;
  if (tenant.from == settings::TenantSource::jwt) {
    try {
      keys = std::make_shared<const identity::KeySet>(identity::KeySet::load_file(tenant.jwt.jwks_file));
    } catch (const identity::KeySetError& e) {
      throw settings::ConfigError(s.source_file, 0, "tenant.jwt.jwks_file", e.what());
    }
    add_decided(decided, "Authorization");
  }
  out = std::make_shared<const identity::Resolver>(tenant, std::move(keys));
}

}  // namespace

std::shared_ptr<const Runtime> Runtime::build(std::shared_ptr<const settings::Settings> s) {
  auto rt = std::make_shared<Runtime>();
  rt->settings_ = std::move(s);
  rt->routes_.reserve(rt->settings_->routes.size());
  add_decided(rt->decided_headers_, rt->settings_->tenant.header);
  add_decided(rt->decided_headers_, rt->settings_->tenant.principal_header);
  build_identity(*rt->settings_, rt->identity_, rt->decided_headers_);
  for (std::size_t i = 0; i < rt->settings_->routes.size(); ++i) {
    const auto& route = rt->settings_->routes[i];
    CompiledRoute compiled;
    compiled.settings = &route;
    compiled.segments = split_path(route.path);
    compiled.templated = std::any_of(compiled.segments.begin(), compiled.segments.end(),
                                     [](const std::string& seg) { return is_placeholder(seg); });
    for (const auto& seg : compiled.segments) {
      if (is_placeholder(seg)) {
        compiled.loose.emplace_back(kAnySegment);
      } else {
        for (auto& part : loose_segments(seg)) compiled.loose.push_back(std::move(part));
      }
    }
    add_decided(rt->decided_headers_, route.key.header);
    for (const auto& h : route.fingerprint.headers) add_decided(rt->decided_headers_, h);
    const std::string at = "routes[" + std::to_string(i) + "]";
    try {
      compiled.key = idempotency::KeySpec::compile(route.key, route.fingerprint.format);
    } catch (const std::invalid_argument& e) {
      throw settings::ConfigError(rt->settings_->source_file, route.source_line, at + ".key", e.what());
    }
    try {
      compiled.fingerprint = idempotency::FingerprintSpec::compile(route.fingerprint, route.key);
    } catch (const std::invalid_argument& e) {
      throw settings::ConfigError(rt->settings_->source_file, route.source_line, at + ".fingerprint",
                                  e.what());
    }
    rt->routes_.push_back(std::move(compiled));
  }
  // After the loop: routes_ no longer moves, so the pointers stay valid.
  for (const auto& route : rt->routes_) {
    if (!route.settings->async) continue;
    StatusTemplate t;
    t.segments = split_path(route.settings->async->status_path);
    t.id_at = static_cast<std::size_t>(
        std::find(t.segments.begin(), t.segments.end(), "{operation_id}") - t.segments.begin());
    t.route = &route;
    rt->status_templates_.push_back(std::move(t));
  }
  rt->policy_ = policy_document(*rt->settings_);
  return rt;
}

std::optional<StatusMatch> Runtime::match_status(std::string_view method,
                                                 std::string_view path) const {
  if (status_templates_.empty() || method != "GET") return std::nullopt;
  const auto segments = split_path(path);
  std::optional<StatusMatch> found;
  for (const auto& t : status_templates_) {
    if (t.segments.size() != segments.size() || t.id_at >= segments.size()) continue;
    bool ok = !segments[t.id_at].empty();
    for (std::size_t i = 0; i < segments.size() && ok; ++i) {
      if (i != t.id_at) ok = t.segments[i] == segments[i];
    }
    if (!ok) continue;
    if (!found) found.emplace().operation_id = segments[t.id_at];
    // Two templates can only both match with the id in the same place if they are equal.
    if (found->operation_id == segments[t.id_at]) found->routes.push_back(t.route);
  }
  return found;
}

const CompiledRoute* Runtime::match(std::string_view method, std::string_view path) const {
  if (routes_.empty()) return nullptr;
  const auto segments = split_path(path);
  for (const auto& route : routes_) {
    if (route.settings->method != method || route.segments.size() != segments.size()) continue;
    bool ok = true;
    for (std::size_t i = 0; i < segments.size() && ok; ++i) {
      const auto& want = route.segments[i];
      ok = is_placeholder(want) ? !segments[i].empty() : want == segments[i];
    }
    if (ok) return &route;
  }
  return nullptr;
}

const CompiledRoute* Runtime::resembles(std::string_view method, std::string_view path) const {
  if (routes_.empty()) return nullptr;
  const auto segments = loose_segments(path);
  for (const auto& route : routes_) {
    if (!iequals(route.settings->method, method) || route.loose.size() != segments.size()) continue;
    bool ok = true;
    for (std::size_t i = 0; i < segments.size() && ok; ++i) {
      ok = route.loose[i] == kAnySegment || route.loose[i] == segments[i];
    }
    if (ok) return &route;
  }
  return nullptr;
}

RuntimeHolder::RuntimeHolder(std::shared_ptr<const Runtime> initial) : current_(std::move(initial)) {}

std::shared_ptr<const Runtime> RuntimeHolder::load() const {
  return current_.load(std::memory_order_acquire);
}

void RuntimeHolder::store(std::shared_ptr<const Runtime> next) {
  current_.store(std::move(next), std::memory_order_release);
}

}  // namespace idem::gateway
