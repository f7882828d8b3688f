// What a start or a reload reads from disk besides the configuration: the TLS files
// (load_tls) and the JWKS (Runtime::build). Rewritten files are read again; unusable ones
// are a ConfigError naming the key, so a reload keeps what runs.
#include <doctest/doctest.h>

#include <filesystem>

#include "app/config.hpp"
#include "test_support/crypto.hpp"

using namespace idem;

namespace {

struct Dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("idem-app-tls-" + std::to_string(::getpid()));
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(std::string_view name, std::string_view text) const { return test::write_file(path, name, text); }
};

std::string config_error_key(const std::function<void()>& f) {
  try {
    f();
  } catch (const settings::ConfigError& e) {
    return e.key() + ": " + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("load_tls builds the listener and upstream contexts, or names the key that is wrong") {
  Dir dir;
  const test::CertificateAuthority ca;
  const auto cert = ca.issue({});
  settings::Settings s;
  s.source_file = "test.yaml";
  s.tls = settings::ListenerTls{dir.write("c.pem", cert.cert_pem), dir.write("k.pem", cert.key_pem), ""};
  s.upstream.https = true;
  s.upstream.host = "orders.internal";
  s.upstream.tls.ca_file = dir.write("ca.pem", ca.cert_pem());
  auto m = app::load_tls(s);
  CHECK(m.listener != nullptr);
  REQUIRE(m.upstream != nullptr);
  CHECK(m.upstream->server_name == "orders.internal");  // the url's host by default
  s.upstream.tls.server_name = "10.1.2.3";
  CHECK(app::load_tls(s).upstream->server_name == "10.1.2.3");

  auto plain = s;
  plain.tls.reset();
  plain.upstream.https = false;
  const auto none = app::load_tls(plain);
  CHECK(none.listener == nullptr);
  CHECK(none.upstream == nullptr);

  auto bad_key = s;
  bad_key.tls->key_file = dir.write("other.key", ca.issue({}).key_pem);
  CHECK(config_error_key([&] { app::load_tls(bad_key); }).rfind("tls: ", 0) == 0);
  auto bad_ca = s;
  bad_ca.upstream.tls.ca_file = (dir.path / "missing.pem").string();
  CHECK(config_error_key([&] { app::load_tls(bad_ca); }).rfind("upstream.tls: ", 0) == 0);
}

TEST_CASE("Runtime::build reads the JWKS each time, and refuses an unusable one by its key") {
  Dir dir;
  const auto first = test::KeyPair::ec("P-256");
  const auto second = test::KeyPair::ec("P-256");
  auto s = std::make_shared<settings::Settings>();
  s->source_file = "test.yaml";
  s->tenant.from = settings::TenantSource::jwt;
  s->tenant.jwt.jwks_file = dir.write("jwks.json", test::jwks({first.public_jwk("k1")}));
  s->tenant.jwt.issuers = {"https://idp.example/"};
  s->tenant.jwt.audiences = {"orders-api"};
  s->tenant.jwt.tenant_claim = "tenant";
  const auto token = [&](const test::KeyPair& key, const char* kid) {
    return test::sign_jwt(std::string("{\"alg\":\"ES256\",\"kid\":\"") + kid + "\"}",
                          "{\"iss\":\"https://idp.example/\",\"aud\":\"orders-api\",\"tenant\":\"acme\",\"exp\":" +
                              std::to_string(test::unix_now() + 60) + "}",
                          key, "ES256");
  };
  const auto verify = [&](const gateway::Runtime& rt, const std::string& t) {
    return identity::verify_token(t, *rt.identity()->keys(), identity::TokenPolicy{{"https://idp.example/"},
                                                                                    {"orders-api"}, "tenant", "",
                                                                                    std::chrono::seconds(0)},
                                  std::chrono::system_clock::now())
        .error;
  };
  const auto before = gateway::Runtime::build(s);
  REQUIRE(before->identity() != nullptr);
  CHECK(verify(*before, token(first, "k1")) == identity::TokenError::none);
  CHECK(verify(*before, token(second, "k2")) == identity::TokenError::unknown_key);

  // The identity provider rotated its key: the file is rewritten, a reload builds again.
  dir.write("jwks.json", test::jwks({second.public_jwk("k2")}));
  const auto after = gateway::Runtime::build(s);
  CHECK(verify(*after, token(second, "k2")) == identity::TokenError::none);
  CHECK(verify(*after, token(first, "k1")) == identity::TokenError::unknown_key);
  CHECK(verify(*before, token(first, "k1")) == identity::TokenError::none);  // what ran is untouched

  dir.write("jwks.json", "{\"keys\": [");
  const auto message = config_error_key([&] { gateway::Runtime::build(s); });
  CHECK(message.rfind("tenant.jwt.jwks_file: ", 0) == 0);
  CHECK(message.find("not valid JSON") != std::string::npos);
  // Header mode reads no file.
  auto header = std::make_shared<settings::Settings>();
  CHECK(gateway::Runtime::build(header)->identity() == nullptr);
}
