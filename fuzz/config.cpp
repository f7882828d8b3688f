// Fuzz target "config": the configuration loader (proxy/settings), from YAML text to
// validated Settings, plus what main() adds before a configuration is used (every route's
// fingerprint compiled, as gateway::Runtime::build does).
//
// Input: the text of a configuration file. ${VAR} expansion sees a fixed environment
// (DATABASE_URL and IDEMPROXY_ADMIN_TOKEN hold secrets, EMPTY is set but empty).
// Properties:
//   1. Loading throws nothing but settings::ConfigError, with a message; compiling an
//      accepted route's fingerprint throws nothing but std::invalid_argument.
//   2. render_effective of an accepted configuration loads again, and renders to the same
//      text (a fixed point), so `check-config` output is itself a valid, equal config.
//   3. Secrets do not show: rendering with another database password and admin token gives
//      the same text.
//
// The code under test, whose line coverage scripts/fuzz --coverage reports:
// covers: proxy/settings/load.cpp
// covers: proxy/settings/syntax.cpp
// covers: proxy/settings/render.cpp
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "idempotency/fingerprint.hpp"
#include "idempotency/key.hpp"
#include "settings/detail.hpp"
#include "settings/settings.hpp"
#include "support/check.hpp"

namespace {

namespace st = idem::settings;
using idem::fuzz::printable;

constexpr const char* kPassword = "pw-from-env-9f2c";
constexpr const char* kToken = "token-from-env-41ab";  // reaches admin.token via ${...}

const char* env(const std::string& name) {
  static const std::string url = std::string("postgresql://idem:") + kPassword + "@db:5432/orders";
  if (name == "DATABASE_URL") return url.c_str();
  if (name == "IDEMPROXY_ADMIN_TOKEN") return kToken;
  if (name == "UPSTREAM_URL") return "http://127.0.0.1:3000";
  if (name == "EMPTY") return "";
  return nullptr;
}

std::shared_ptr<const st::Settings> load(const std::string& text, const char* what) {
  try {
    return st::detail::load_text(text, "fuzz.yaml", env);
  } catch (const st::ConfigError& e) {
    IDEM_CHECK(std::strlen(e.what()) > 0, std::string("empty ConfigError message ") + what);
    throw;
  } catch (const std::exception& e) {
    idem::fuzz::property_failed("only ConfigError", std::string("loading ") + what + " threw " +
                                typeid(e).name() + ": " + e.what(), __FILE__, __LINE__);
  } catch (...) {
    idem::fuzz::property_failed("only ConfigError", std::string("loading ") + what + " threw a non-std exception",
                                __FILE__, __LINE__);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const st::Settings> s;
  try {
    s = load(text, "the input");
  } catch (const st::ConfigError& e) {
    // IDEM_FUZZ_VERBOSE=1 fuzz_config FILE shows why a seed is refused (writing seeds).
    if (std::getenv("IDEM_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "refused: %s\n", e.full_message().c_str());
    return 0;
  }

  for (const auto& route : s->routes) {
    try {
      (void)idem::idempotency::KeySpec::compile(route.key, route.fingerprint.format);
      (void)idem::idempotency::FingerprintSpec::compile(route.fingerprint, route.key);
    } catch (const std::invalid_argument& e) {
      if (std::getenv("IDEM_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "refused route: %s\n", e.what());
      return 0;  // main() reports it as a ConfigError naming the route
    }
  }

  const std::string rendered = st::render_effective(*s);
  // Property 3: the secret fields do not show. Rendering the same settings with other
  // secrets in database.url (the password the environment supplied) and admin.token must give
  // the same text; a difference is a secret leaking into the output.
  st::Settings other = *s;
  for (std::size_t at; (at = other.database.url.find(kPassword)) != std::string::npos;) {
    other.database.url.replace(at, std::strlen(kPassword), "another-password");
  }
  if (!other.admin.token.empty()) other.admin.token += "-another";
  IDEM_CHECK(st::render_effective(other) == rendered,
             "a secret shows in the rendered configuration:\n" + rendered + "\n--- with other secrets:\n" +
                 st::render_effective(other));
  std::shared_ptr<const st::Settings> again;
  try {
    again = load(rendered, "the rendered configuration");
  } catch (const st::ConfigError& e) {
    IDEM_CHECK(false, "the rendered configuration does not load (" + e.full_message() + "):\n" + rendered +
                          "\n--- from input:\n" + printable(text, 2000));
  }
  const std::string twice = st::render_effective(*again);
  IDEM_CHECK(twice == rendered, "rendering is not a fixed point:\n" + rendered + "\n--- then:\n" + twice);
  return 0;
}
