#include "support/sidecar.hpp"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "common/text.hpp"
#include "support/env.hpp"
#include "support/http.hpp"

namespace idem::it {

namespace {

// Double-quoted YAML scalar: the one style in which every string, including ones with
// ':', '#', '{' or a leading '/', means exactly itself.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\x";
          idem::text::append_hex_digits(out, c, 2);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

// Sizes and durations: a bare integer stays an integer (a byte count), anything else
// ("64KiB", "250ms") is a string.
std::string scalar(std::string_view text) {
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  return digits ? std::string(text) : quote(text);
}

std::string string_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += (i ? ", " : "") + quote(items[i]);
  }
  return out + "]";
}

std::string int_list(const std::vector<int>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(items[i]);
  }
  return out + "]";
}

std::string indent(std::string_view text, std::string_view prefix) {
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    out += std::string(prefix) + std::string(text.substr(start, end - start)) + "\n";
    start = end + 1;
  }
  return out;
}

// Writes "key: value" at `pad` unless the value is empty (the sidecar's default applies).
void put(std::ostringstream& out, std::string_view pad, std::string_view key,
         std::string_view value, bool as_scalar = false) {
  if (!value.empty()) {
    out << pad << key << ": " << (as_scalar ? scalar(value) : quote(value)) << "\n";
  }
}

void put_int(std::ostringstream& out, std::string_view pad, std::string_view key,
             const std::optional<int>& value) {
  if (value) {
    out << pad << key << ": " << *value << "\n";
  }
}

void render_route(std::ostringstream& out, const RouteOptions& r) {
  out << "  - name: " << quote(r.name) << "\n";
  out << "    method: " << quote(r.method) << "\n";
  out << "    path: " << quote(r.path) << "\n";
  put(out, "    ", "scope", r.scope);
  out << "    key:\n";
  put(out, "      ", "from", r.key_from);
  out << "      header: " << quote(r.key_header) << "\n";
  put(out, "      ", "pointer", r.key_pointer);
  put(out, "      ", "param", r.key_param);
  out << "      required: " << (r.key_required ? "true" : "false") << "\n";
  put_int(out, "      ", "max_length", r.key_max_length);
  out << "    fingerprint:\n";
  put(out, "      ", "format", r.fingerprint_format);
  if (!r.fingerprint_media_types.empty()) {
    out << "      media_types: " << string_list(r.fingerprint_media_types) << "\n";
  }
  put(out, "      ", "repeated_names", r.fingerprint_repeated_names);
  out << "      version: " << quote(r.fingerprint_version) << "\n";
  if (r.fingerprint_fields) {
    out << "      fields: " << string_list(*r.fingerprint_fields) << "\n";
  }
  out << "      ignore: " << string_list(r.fingerprint_ignore) << "\n";
  if (r.fingerprint_defaults.empty()) {
    out << "      defaults: {}\n";
  } else {
    out << "      defaults:\n";
    for (const auto& [pointer, json_value] : r.fingerprint_defaults) {
      out << "        " << quote(pointer) << ": " << json_value << "\n";
    }
  }
  out << "      headers: " << string_list(r.fingerprint_headers) << "\n";
  out << "      query: " << (r.fingerprint_query ? "true" : "false") << "\n";
  put(out, "    ", "retention", r.retention, true);
  put(out, "    ", "lease", r.lease, true);
  put(out, "    ", "wait", r.wait, true);
  put(out, "    ", "retry_after", r.retry_after, true);
  out << "    mismatch_status: " << r.mismatch_status << "\n";
  out << "    store:\n";
  out << "      statuses: " << string_list(r.store_statuses) << "\n";
  out << "      except: " << int_list(r.store_except) << "\n";
  out << "    replay_headers: " << string_list(r.replay_headers) << "\n";
  put(out, "    ", "max_stored_body", r.max_stored_body, true);
  out << indent(r.extra_yaml, "    ");
}

}  // namespace

std::string sidecar_config(const SidecarOptions& o) {
  if (o.port == 0) {
    throw Failure("sidecar_config: SidecarOptions::port is 0 (Sidecar picks one; set it when "
                  "rendering a config by hand)");
  }
  if (o.upstream_url.empty()) {
    throw Failure("sidecar_config: SidecarOptions::upstream_url is empty");
  }
  std::ostringstream out;
  out << "# Generated by the integration harness (integration/support/sidecar.cpp).\n";
  out << "listen: " << quote("127.0.0.1:" + std::to_string(o.port)) << "\n";

  out << "upstream:\n";
  out << "  url: " << quote(o.upstream_url) << "\n";
  put(out, "  ", "connect_timeout", o.upstream_connect_timeout, true);
  put(out, "  ", "response_timeout", o.upstream_response_timeout, true);
  put(out, "  ", "max_response_body", o.upstream_max_response_body, true);
  out << indent(o.upstream_extra_yaml, "  ");

  out << "database:\n";
  out << "  url: " << quote(o.database_url.empty() ? database_url() : o.database_url) << "\n";
  put_int(out, "  ", "pool_size", o.database_pool_size);
  put(out, "  ", "connect_timeout", o.database_connect_timeout, true);
  put(out, "  ", "statement_timeout", o.database_statement_timeout, true);
  put(out, "  ", "migrate", o.database_migrate);
  put(out, "  ", "start_wait", o.database_start_wait, true);

  out << "tenant:\n";
  out << "  header: " << quote(o.tenant_header) << "\n";
  out << "  principal_header: " << quote(o.principal_header) << "\n";
  out << indent(o.tenant_extra_yaml, "  ");

  std::ostringstream limits;
  put(limits, "  ", "max_header_bytes", o.max_header_bytes, true);
  put(limits, "  ", "max_request_body", o.max_request_body, true);
  put(limits, "  ", "header_timeout", o.header_timeout, true);
  put(limits, "  ", "body_timeout", o.body_timeout, true);
  put(limits, "  ", "idle_timeout", o.idle_timeout, true);
  put_int(limits, "  ", "max_connections", o.max_connections);
  put(limits, "  ", "drain_timeout", o.drain_timeout, true);
  if (!limits.str().empty()) {
    out << "limits:\n" << limits.str();
  }

  out << "admin:\n";
  out << "  listen: " << quote(o.admin_listen) << "\n";
  put(out, "  ", "token", o.admin_token);

  out << "log:\n";
  put(out, "  ", "level", o.log_level);
  put(out, "  ", "format", o.log_format);

  std::ostringstream cleanup;
  put(cleanup, "  ", "interval", o.cleanup_interval, true);
  put_int(cleanup, "  ", "batch", o.cleanup_batch);
  if (!cleanup.str().empty()) {
    out << "cleanup:\n" << cleanup.str();
  }

  put(out, "", "unmatched", o.unmatched);
  if (o.routes.empty()) {
    out << "routes: []\n";
  } else {
    out << "routes:\n";
    for (const auto& route : o.routes) {
      render_route(out, route);
    }
  }
  out << indent(o.extra_yaml, "");
  return out.str();
}

// ------------------------------------------------------------------------------ Sidecar

Sidecar::Sidecar(SidecarOptions options, SidecarLaunch launch) : launch_(std::move(launch)) {
  if (options.port == 0) {
    options.port = free_port();
  }
  port_ = options.port;
  yaml_ = sidecar_config(options);
  start();
}

Sidecar::Sidecar(std::string yaml, std::uint16_t port, SidecarLaunch launch)
    : launch_(std::move(launch)), port_(port), yaml_(std::move(yaml)) {
  start();
}

Sidecar::~Sidecar() = default;

std::string Sidecar::url() const { return "http://127.0.0.1:" + std::to_string(port_); }

void Sidecar::wait_for_log(std::string_view needle, std::size_t n, Millis timeout) {
  wait_until(
      [&] {
        const auto text = log();
        std::size_t count = 0;
        for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
        return count >= n;
      },
      timeout, "the sidecar's log to show '" + std::string(needle) + "' " + std::to_string(n) + " time(s)");
}

void Sidecar::start(bool wait) {
  if (launch_.binary.empty()) {
    launch_.binary = idemproxy_binary();
  }
  config_path_ = dir_.write_file("idemproxy.yaml", yaml_);
  process_ = std::make_unique<Process>(ProcessOptions{
      .executable = launch_.binary,
      .args = {"serve", "--config", config_path_.string()},
      .env = launch_.env,
      .name = "idemproxy",
  });
  if (wait && launch_.wait_until_listening) {
    wait_until_listening(launch_.start_timeout);
  }
}

void Sidecar::wait_until_listening(Millis timeout) {
  const std::string what = "idemproxy to listen on 127.0.0.1:" + std::to_string(port_);
  try {
    wait_until(
        [&] {
          if (port_open(port_)) {
            return true;
          }
          if (!process_->running()) {
            throw Failure("idemproxy ended (" + process_->exit_status()->describe() +
                          ") before listening on " + std::to_string(port_) +
                          "; its log ends with:\n" + process_->log_tail());
          }
          return false;
        },
        timeout, what);
  } catch (const Failure& e) {
    if (!process_->running()) {
      throw;
    }
    throw Failure(std::string(e.what()) + "; its log ends with:\n" + process_->log_tail());
  }
}

void Sidecar::signal(int sig) { process_->signal(sig); }

void Sidecar::kill9() { process_->kill(); }

ExitStatus Sidecar::stop(Millis timeout) {
  process_->signal(SIGTERM);
  if (auto status = process_->wait_exit(timeout)) {
    return *status;
  }
  const std::string tail = process_->log_tail();
  process_->kill();
  throw Failure("idemproxy did not exit within " + std::to_string(timeout.count()) +
                " ms of SIGTERM; its log ends with:\n" + tail);
}

void Sidecar::restart(bool wait) {
  if (process_->running()) {
    stop();
  }
  start(wait);
}

void Sidecar::reload(std::string yaml) {
  yaml_ = std::move(yaml);
  // Write a new file and rename it over the old one, so the sidecar never reads a
  // half-written config when the signal arrives.
  const auto staged = dir_.write_file("idemproxy.yaml.new", yaml_);
  std::filesystem::rename(staged, config_path_);
  process_->signal(SIGHUP);
}

bool Sidecar::running() { return process_->running(); }

std::string Sidecar::log() const { return process_->log(); }

std::string Sidecar::log_tail(std::size_t lines) const { return process_->log_tail(lines); }

CommandResult run_idemproxy(std::vector<std::string> args, EnvList env, Millis timeout) {
  return run_command(ProcessOptions{.executable = idemproxy_binary(),
                                    .args = std::move(args),
                                    .env = std::move(env),
                                    .name = "idemproxy"},
                     timeout);
}

}  // namespace idem::it
