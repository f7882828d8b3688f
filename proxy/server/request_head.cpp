#include "server/request_head.hpp"

#include <string>

#include "server/target.hpp"

namespace idem::server {

HeadCheck prepare_request_head(http::request_header<>& header, bool normalize) {
  const auto hosts = header.count(http::field::host);
  if (hosts > 1) return {false, "more than one Host field"};
  if (hosts == 0 && header.version() >= 11) return {false, "an HTTP/1.1 request without Host"};
  if (hosts == 1 && !valid_host_value(header[http::field::host])) {
    return {false, "an invalid Host field"};
  }

  if (normalize) {
    auto target = normalize_target(header.target(), header.method() == http::verb::options);
    if (!target.ok) return {false, target.problem};
    if (target.target != header.target()) header.target(target.target);
    if (target.form == TargetForm::absolute) header.set(http::field::host, target.authority);
  }

  if (header.count(http::field::connection) > 1) {
    std::string joined;
    for (const auto& f : header) {
      if (f.name() != http::field::connection) continue;
      if (f.value().empty()) continue;
      if (!joined.empty()) joined += ", ";
      joined.append(f.value().data(), f.value().size());
    }
    header.set(http::field::connection, joined);
  }
  return {};
}

}  // namespace idem::server
