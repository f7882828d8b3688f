#include "identity/identity.hpp"

#include <algorithm>

#include "common/text.hpp"

namespace idem::identity {
namespace {

namespace http = boost::beast::http;

constexpr std::string_view kBearerChallenge = "Bearer realm=\"idemproxy\"";
constexpr std::string_view kInvalidTokenChallenge = "Bearer realm=\"idemproxy\", error=\"invalid_token\"";

Resolution refuse(http::status status, std::string_view code, std::string_view title,
                  std::string detail, std::string_view challenge = {}) {
  Resolution r;
  r.status = status;
  r.code = code;
  r.title = title;
  r.detail = std::move(detail);
  r.challenge = challenge;
  return r;
}

bool is_token68_char(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == '=';
}

std::size_t count_fields(const http::fields& fields, std::string_view name) {
  std::size_t n = 0;
  for (const auto& f : fields) {
    if (text::iequals(f.name_string(), name)) ++n;
  }
  return n;
}

Resolution from_token(const TokenResult& t) {
  switch (t.error) {
    case TokenError::none: break;
    case TokenError::expired:
      return refuse(http::status::unauthorized, "token_expired", "Token expired", t.reason, kInvalidTokenChallenge);
    case TokenError::not_yet_valid:
      return refuse(http::status::unauthorized, "token_not_yet_valid", "Token not yet valid", t.reason,
                    kInvalidTokenChallenge);
    case TokenError::issuer:
      return refuse(http::status::unauthorized, "token_issuer_invalid", "Token issuer not accepted", t.reason,
                    kInvalidTokenChallenge);
    case TokenError::audience:
      return refuse(http::status::unauthorized, "token_audience_invalid", "Token audience not accepted",
                    t.reason, kInvalidTokenChallenge);
    case TokenError::claim:
      return refuse(http::status::unauthorized, "token_tenant_invalid", "Token names no valid tenant", t.reason,
                    kInvalidTokenChallenge);
    case TokenError::malformed:
    case TokenError::algorithm:
    case TokenError::unknown_key:
    case TokenError::signature:
      return refuse(http::status::unauthorized, "token_invalid", "Token invalid", t.reason, kInvalidTokenChallenge);
  }
  Resolution r;
  r.ok = true;
  r.tenant = t.tenant;
  r.principal = t.principal;
  return r;
}

}  // namespace

Bearer bearer_token(const http::fields& fields) {
  Bearer b;
  for (const auto& f : fields) {
    if (f.name() != http::field::authorization) continue;
    if (b.present) {
      b.several = true;
      return b;
    }
    b.present = true;
    const std::string_view value = text::trim_ows(f.value());
    constexpr std::string_view scheme = "bearer";
    if (value.size() <= scheme.size() || !text::iequals(value.substr(0, scheme.size()), scheme) ||
        value[scheme.size()] != ' ') {
      continue;
    }
    const std::string_view token = text::trim_ows(value.substr(scheme.size() + 1));
    b.well_formed = !token.empty() && std::all_of(token.begin(), token.end(), is_token68_char);
    if (b.well_formed) b.token = token;
  }
  return b;
}

Resolution from_certificate(std::span<const std::string> uris, std::string_view prefix) {
  const std::string* match = nullptr;
  for (const auto& uri : uris) {
    if (uri.size() <= prefix.size() || uri.compare(0, prefix.size(), prefix) != 0) continue;
    if (match) {
      return refuse(http::status::unauthorized, "certificate_tenant_invalid", "Certificate names no tenant",
                    "the client certificate has several URI SANs under the tenant prefix");
    }
    match = &uri;
  }
  if (!match) {
    return refuse(http::status::unauthorized, "certificate_tenant_invalid", "Certificate names no tenant",
                  uris.empty() ? "no verified client certificate with a URI SAN"
                               : "the client certificate has no URI SAN under the tenant prefix");
  }
  const std::string_view rest = std::string_view(*match).substr(prefix.size());
  const std::string_view tenant = rest.substr(0, rest.find('/'));
  if (!valid_tenant_value(tenant) || tenant.find_first_of("?#%") != std::string_view::npos) {
    return refuse(http::status::unauthorized, "certificate_tenant_invalid", "Certificate names no tenant",
                  "the tenant segment of the client certificate's URI SAN is not a valid tenant");
  }
  Resolution r;
  r.ok = true;
  r.tenant = std::string(tenant);
  r.principal = *match;
  return r;
}

Resolver::Resolver(const settings::TenantSettings& tenant, std::shared_ptr<const KeySet> keys)
    : tenant_(tenant), keys_(std::move(keys)) {
  policy_.issuers = tenant.jwt.issuers;
  policy_.audiences = tenant.jwt.audiences;
  policy_.tenant_claim = tenant.jwt.tenant_claim;
  if (!tenant.principal_header.empty()) policy_.principal_claim = tenant.jwt.principal_claim;
  policy_.leeway = std::chrono::duration_cast<std::chrono::seconds>(tenant.jwt.leeway);
}

Resolution Resolver::resolve(const http::fields& fields, std::span<const std::string> client_uris,
                             std::chrono::system_clock::time_point now) const {
  // Whatever the client says in these headers would otherwise sit next to (or instead of)
  // the verified value: refused rather than overwritten, so a client that still sends
  // one learns that it is no longer read.
  for (const std::string* name : {&tenant_.header, &tenant_.principal_header}) {
    if (!name->empty() && count_fields(fields, *name) > 0) {
      return refuse(http::status::bad_request, "identity_header_forbidden", "Identity header forbidden",
                    "the " + *name + " header is set by idemproxy from the verified identity; do not send it");
    }
  }
  Resolution r;
  if (tenant_.from == settings::TenantSource::mtls) {
    r = from_certificate(client_uris, tenant_.mtls.uri_prefix);
  } else {
    const Bearer b = bearer_token(fields);
    if (b.several) {
      return refuse(http::status::unauthorized, "token_invalid", "Token invalid",
                    "more than one Authorization field", kInvalidTokenChallenge);
    }
    if (!b.present) {
      return refuse(http::status::unauthorized, "token_missing", "Token missing",
                    "this request needs an Authorization: Bearer token", kBearerChallenge);
    }
    if (!b.well_formed) {
      return refuse(http::status::unauthorized, "token_missing", "Token missing",
                    "the Authorization field is not a Bearer token", kBearerChallenge);
    }
    r = from_token(verify_token(b.token, *keys_, policy_, now));
  }
  if (r.ok && tenant_.principal_header.empty()) r.principal.clear();
  return r;
}

void Resolver::apply(const Resolution& r, http::fields& fields) const {
  fields.set(tenant_.header, r.tenant);
  if (!tenant_.principal_header.empty()) fields.set(tenant_.principal_header, r.principal);
}

}  // namespace idem::identity
