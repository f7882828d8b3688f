// The tracing section: defaults, the OTLP endpoint's URL and its refusals, the sample
// share, and the round trip through render_effective.
#include <doctest/doctest.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;

TEST_CASE("tracing: no export by default, every new trace sampled once exporting") {
  const auto s = load(kMinimal);
  CHECK(s->tracing.otlp_endpoint.empty());
  CHECK(s->tracing.sample == 1.0);
}

TEST_CASE("tracing: the OTLP endpoint is an http URL; its path defaults to /v1/traces") {
  const auto s = load(kMinimal + "tracing:\n  otlp_endpoint: http://127.0.0.1:4318\n  sample: 0.25\n");
  CHECK(s->tracing.host == "127.0.0.1");
  CHECK(s->tracing.port == 4318);
  CHECK(s->tracing.path == "/v1/traces");
  CHECK(s->tracing.sample == 0.25);
  const auto p = load(kMinimal + "tracing:\n  otlp_endpoint: http://collector/otlp/v1/traces\n");
  CHECK(p->tracing.port == 80);
  CHECK(p->tracing.path == "/otlp/v1/traces");
  CHECK(load(kMinimal + "tracing: {otlp_endpoint: \"\"}\n")->tracing.otlp_endpoint.empty());

  CHECK_CONFIG_ERROR(kMinimal + "tracing:\n  otlp_endpoint: https://collector:4318\n", 6,
                     "tracing.otlp_endpoint", "https is not supported");
  CHECK_CONFIG_ERROR(kMinimal + "tracing:\n  otlp_endpoint: collector:4318\n", 6,
                     "tracing.otlp_endpoint", "");
  for (const char* bad : {"1.5", "-0.1", "half", "0.5x", "nan"}) {
    INFO(bad);
    CHECK_CONFIG_ERROR(kMinimal + "tracing:\n  sample: " + bad + "\n", 6, "tracing.sample",
                       "must be a number from 0 to 1");
  }
  CHECK_CONFIG_ERROR(kMinimal + "tracing:\n  exporter: otlp\n", 6, "tracing.exporter", "unknown key");
}

TEST_CASE("tracing: render_effective shows it and loads back") {
  const auto s = load(kMinimal + "tracing:\n  otlp_endpoint: http://127.0.0.1:4318/v1/traces\n  sample: 0.1\n");
  const auto text = render_effective(*s);
  CHECK(text.find("tracing:\n  otlp_endpoint: \"http://127.0.0.1:4318/v1/traces\"\n  sample: 0.1\n") !=
        std::string::npos);
  const auto again = load(text);
  CHECK(again->tracing.sample == 0.1);
  CHECK(again->tracing.path == "/v1/traces");
  CHECK(render_effective(*again) == text);
}
