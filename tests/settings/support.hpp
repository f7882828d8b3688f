#pragma once
// Shared helpers of the settings tests: an injected environment and error expectations.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "settings/detail.hpp"
#include "settings/settings.hpp"

namespace idem::settings::test {

using Env = std::map<std::string, std::string>;

inline detail::EnvLookup lookup(const Env& env) {
  return [&env](const std::string& name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

inline std::shared_ptr<const Settings> load(const std::string& yaml, const Env& env = {}) {
  return detail::load_text(yaml, "test.yaml", lookup(env));
}

// The smallest valid configuration; tests append to it.
inline const std::string kMinimal =
    "upstream:\n"
    "  url: http://127.0.0.1:3000\n"
    "database:\n"
    "  url: postgresql://app@db/orders\n";

struct Failure {
  int line = -1;
  std::string key;
  std::string what;  // the full message: file:line: key: message
};

inline Failure failure(const std::string& yaml, const Env& env = {}) {
  try {
    load(yaml, env);
  } catch (const ConfigError& e) {
    CHECK(e.file() == "test.yaml");
    return {e.line(), e.key(), e.full_message()};
  }
  FAIL("expected a ConfigError for:\n" << yaml);
  return {};
}

}  // namespace idem::settings::test

// Checks line, key and a fragment of the message of the error `yaml` must raise.
#define CHECK_CONFIG_ERROR(yaml, expected_line, expected_key, fragment)                \
  do {                                                                                 \
    const auto f_ = ::idem::settings::test::failure(yaml);                            \
    INFO("error was: " << f_.what);                                                    \
    CHECK(f_.line == (expected_line));                                                 \
    CHECK(f_.key == (expected_key));                                                   \
    CHECK(f_.what.find(fragment) != std::string::npos);                               \
  } while (false)
