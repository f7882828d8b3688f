// TLS on both sides and verified identity (issue 14, items 1 and 2), end to end: a real
// sidecar process with a TLS listener, a real test backend behind an https upstream, real
// PostgreSQL, and clients that are curl and the project's own TLS client
// (test_support/tls_client.hpp). Certificates, keys and tokens are made here at run time
// with OpenSSL (test_support/crypto.hpp). Every case checks what reached the backend and
// which rows exist, not only what the client was told.
#include <csignal>
#include <fstream>
#include <sstream>

#include "security_common.hpp"
#include "test_support/crypto.hpp"
#include "test_support/tls_client.hpp"

using namespace idem::it;
using namespace idem::it::security;
using idem::test::CertificateAuthority;
using idem::test::CertificateOptions;
using idem::test::KeyPair;
using idem::test::TlsClient;
using idem::test::TlsClientOptions;

namespace {

// Certificate files of one test: a CA, and what it (or another CA) issues.
struct Pki {
  TempDir dir{"idem-tls"};
  CertificateAuthority ca{"idemproxy e2e CA"};
  std::string ca_file = write("ca.pem", ca.cert_pem());

  std::string write(std::string_view name, std::string_view text) const {
    return idem::test::write_file(dir.path(), name, text);
  }
  struct Pair {
    std::string cert_file, key_file;
  };
  Pair issue(std::string_view stem, const CertificateOptions& options = {},
             const CertificateAuthority* by = nullptr) const {
    const auto c = (by ? *by : ca).issue(options);
    return {write(std::string(stem) + ".pem", c.cert_pem), write(std::string(stem) + ".key", c.key_pem)};
  }
};

std::string tls_yaml(const Pki::Pair& server, const std::string& client_ca = {}) {
  std::string y = "tls:\n  cert_file: \"" + server.cert_file + "\"\n  key_file: \"" + server.key_file + "\"\n";
  if (!client_ca.empty()) y += "  client_ca_file: \"" + client_ca + "\"\n";
  return y;
}

struct Curl {
  int exit_code = -1;
  int status = 0;
  std::string body;
  std::string headers;
  std::string output;  // curl's own messages
};

// curl against https://<name>:<port><target>, <name> resolved to 127.0.0.1, trusting
// `ca_file` (when not empty). `extra`: more curl arguments (-H, -d, --cert...).
Curl curl(const Pki& pki, std::uint16_t port, std::string_view target, std::vector<std::string> extra,
          const std::string& name = "localhost", const std::string& ca_file = "use-pki") {
  static int n = 0;
  const std::string stem = "curl-" + std::to_string(++n);
  const std::string body_file = (pki.dir.path() / (stem + ".body")).string();
  const std::string head_file = (pki.dir.path() / (stem + ".head")).string();
  std::vector<std::string> args = {"-sS", "--max-time", "10", "--resolve",
                                   name + ":" + std::to_string(port) + ":127.0.0.1",
                                   "-o", body_file, "-D", head_file, "-w", "\\nHTTP_CODE=%{http_code}\\n"};
  const std::string ca = ca_file == "use-pki" ? pki.ca_file : ca_file;
  if (!ca.empty()) args.insert(args.end(), {"--cacert", ca});
  for (auto& e : extra) args.push_back(std::move(e));
  args.push_back("https://" + name + ":" + std::to_string(port) + std::string(target));
  const auto result = run_command(ProcessOptions{.executable = "curl", .args = args, .name = stem});
  Curl out;
  out.exit_code = result.status.code();
  out.output = result.output;
  const auto at = result.output.find("HTTP_CODE=");
  if (at != std::string::npos) out.status = std::atoi(result.output.c_str() + at + 10);
  const auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  out.body = slurp(body_file);
  out.headers = slurp(head_file);
  return out;
}

std::vector<std::string> order_args(const std::string& key, const Headers& headers = {}) {
  std::vector<std::string> a = {"-H", "Content-Type: application/json", "-H", "Idempotency-Key: " + key,
                                "--data-binary", kOrder};
  for (const auto& [name, value] : headers) a.insert(a.end(), {"-H", name + ": " + value});
  return a;
}

TlsClientOptions trusting(const Pki& pki, std::string name = "localhost") {
  TlsClientOptions o;
  o.ca_pem = pki.ca.cert_pem();
  o.server_name = std::move(name);
  return o;
}

}  // namespace

TEST_CASE("tls listener: curl and the project's client that trust the CA are served; others are refused") {
  Pki pki;
  const auto server = pki.issue("server");
  World w([&](SidecarOptions& o) { o.extra_yaml = tls_yaml(server); });

  // curl, trusting the CA: forwarded once, recorded, replayed.
  const auto key = unique("key");
  const auto first = curl(pki, w.sidecar->port(), "/orders", order_args(key, {{"X-Tenant-Id", w.tenant}}));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.status == 201);
  const auto replay = curl(pki, w.sidecar->port(), "/orders", order_args(key, {{"X-Tenant-Id", w.tenant}}));
  CHECK(replay.status == 201);
  CHECK(replay.headers.find("Idempotent-Replayed: true") != std::string::npos);
  CHECK(replay.body == first.body);
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  CHECK(read_row(w.db, w.tenant, key)->state == "completed");

  // The project's own TLS client: two requests on one kept-alive TLS connection.
  TlsClient client(w.sidecar->port(), trusting(pki));
  REQUIRE_MESSAGE(client.connected(), client.handshake_error().value_or(""));
  CHECK(client.alpn() == "http/1.1");
  const auto second_key = unique("key");
  CHECK(client.request("POST", "/orders", order_headers(w.tenant, second_key), kOrder).status == 201);
  CHECK(client.request("POST", "/orders", order_headers(w.tenant, second_key), kOrder).header("Idempotent-Replayed") ==
        "true");
  CHECK(calls_for(w.backend, w.tenant).size() == 2);

  // A client that does not trust the certificate, or that asked for another name, is refused
  // before any byte of a request: curl's exit 60, the project's client's verify failure.
  const CertificateAuthority stranger("not the sidecar's CA");
  const auto stranger_ca = pki.write("stranger.pem", stranger.cert_pem());
  const auto bad_ca_key = unique("key");
  const auto untrusted = curl(pki, w.sidecar->port(), "/orders", order_args(bad_ca_key, {{"X-Tenant-Id", w.tenant}}),
                              "localhost", stranger_ca);
  CHECK(untrusted.exit_code == 60);
  const auto wrong_name = curl(pki, w.sidecar->port(), "/orders", order_args(bad_ca_key, {{"X-Tenant-Id", w.tenant}}),
                               "orders.example");
  CHECK(wrong_name.exit_code == 60);
  CHECK(wrong_name.output.find("orders.example") != std::string::npos);
  auto untrusting = trusting(pki);
  untrusting.ca_pem = stranger.cert_pem();
  CHECK(TlsClient(w.sidecar->port(), untrusting).handshake_error()->find("certificate verify failed") !=
        std::string::npos);
  CHECK(TlsClient(w.sidecar->port(), trusting(pki, "orders.example")).handshake_error()->find("certificate verify failed") !=
        std::string::npos);
  // Plain HTTP on the TLS port gets no HTTP answer.
  CHECK(raw_exchange(w.sidecar->port(), raw_post("/orders", "X-Tenant-Id: " + w.tenant + "\r\n", with_length(kOrder)),
                     5s)
            .find("HTTP/1.1 2") == std::string::npos);
  CHECK(calls_for(w.backend, w.tenant).size() == 2);
  CHECK(read_row(w.db, w.tenant, bad_ca_key) == std::nullopt);
}

TEST_CASE("tls listener: SIGHUP rotates the certificate for new connections; a bad one keeps the old") {
  Pki pki;
  CertificateOptions first_name;
  first_name.common_name = "first";
  const auto first = pki.issue("first", first_name);
  World w([&](SidecarOptions& o) {
    o.extra_yaml = tls_yaml(first);
    o.log_level = "info";
  });
  TlsClient before(w.sidecar->port(), trusting(pki));
  REQUIRE(before.connected());
  CHECK(before.peer_common_name() == "first");

  // Rotation as cert-manager does it: new files in place, then SIGHUP.
  CertificateOptions second_name;
  second_name.common_name = "second";
  const auto second = pki.issue("second", second_name);
  std::filesystem::copy_file(second.cert_file, first.cert_file, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(second.key_file, first.key_file, std::filesystem::copy_options::overwrite_existing);
  w.sidecar->signal(SIGHUP);
  w.sidecar->wait_for_log("configuration reloaded");
  TlsClient after(w.sidecar->port(), trusting(pki));
  REQUIRE(after.connected());
  CHECK(after.peer_common_name() == "second");
  // The connection opened before the rotation goes on with its own session.
  CHECK(before.request("POST", "/orders", order_headers(w.tenant, unique("key")), kOrder).status == 201);

  // A key that does not match the certificate: refused, the log says why, the running
  // certificate stays.
  pki.write("first.key", pki.ca.issue({}).key_pem);
  w.sidecar->signal(SIGHUP);
  w.sidecar->wait_for_log("reload refused");
  CHECK(w.sidecar->log().find("tls: tls.key_file " + first.key_file) != std::string::npos);
  TlsClient still(w.sidecar->port(), trusting(pki));
  REQUIRE(still.connected());
  CHECK(still.peer_common_name() == "second");
  CHECK(still.request("POST", "/orders", order_headers(w.tenant, unique("key")), kOrder).status == 201);
  CHECK(calls_for(w.backend, w.tenant).size() == 2);
}

TEST_CASE("https upstream: the backend's certificate and name are verified; a refusal sends nothing and frees the key") {
  Pki pki;
  const auto backend_cert = pki.issue("backend");
  TestBackend::Options bo;
  bo.tls_cert_file = backend_cert.cert_file;
  bo.tls_key_file = backend_cert.key_file;
  TestBackend backend(bo);
  Db db(database_url());
  const std::string tenant = unique("tenant");
  const auto sidecar_for = [&](const std::string& url, const std::string& tls) {
    auto o = options_for(backend);
    o.upstream_url = url;
    o.upstream_extra_yaml = tls;
    o.log_level = "info";
    return std::make_unique<Sidecar>(o);
  };

  {  // Trusted CA, the name in the url: forwarded over TLS, recorded once.
    auto sidecar = sidecar_for(backend.tls_url("localhost"), "tls:\n  ca_file: \"" + pki.ca_file + "\"\n");
    HttpClient client(sidecar->port());
    const auto key = unique("key");
    const auto first = client.post("/orders", kOrder, order_headers(tenant, key));
    CHECK(first.status == 201);
    CHECK(client.post("/orders", kOrder, order_headers(tenant, key)).header("Idempotent-Replayed") == "true");
    CHECK(calls_for(backend, tenant).size() == 1);
    CHECK(read_row(db, tenant, key)->state == "completed");
    // An IP address in the url is verified as one (the certificate names 127.0.0.1).
    auto by_ip = sidecar_for("https://127.0.0.1:" + std::to_string(backend.tls_port()),
                             "tls:\n  ca_file: \"" + pki.ca_file + "\"\n");
    CHECK(HttpClient(by_ip->port()).post("/orders", kOrder, order_headers(tenant, unique("key"))).status == 201);
    CHECK(calls_for(backend, tenant).size() == 2);
  }

  const CertificateAuthority stranger("not the backend's CA");
  const auto stranger_ca = pki.write("stranger.pem", stranger.cert_pem());
  struct Case {
    const char* what;
    std::string tls;
    const char* logged;
  };
  const Case refused[] = {
      {"untrusted CA", "tls:\n  ca_file: \"" + stranger_ca + "\"\n", "unable to get local issuer certificate"},
      {"wrong name", "tls:\n  ca_file: \"" + pki.ca_file + "\"\n  server_name: orders.internal\n", "hostname mismatch"},
      {"system trust store only", "", "unable to get local issuer certificate"}};
  for (const auto& c : refused) {
    INFO(c.what);
    auto sidecar = sidecar_for(backend.tls_url("localhost"), c.tls);
    HttpClient client(sidecar->port());
    const auto key = unique("key");
    const auto res = client.post("/orders", kOrder, order_headers(tenant, key));
    CHECK(res.status == 502);
    CHECK(problem_code(res) == "upstream_unavailable");
    CHECK(read_row(db, tenant, key) == std::nullopt);  // released: the key is free
    CHECK(calls_for(backend, tenant).size() == 2);     // nothing more reached the backend
    sidecar->wait_for_log(c.logged);
  }

  {  // verify: false, written explicitly: forwarded, and said loudly at start.
    auto sidecar = sidecar_for(backend.tls_url("localhost"), "tls:\n  verify: false\n");
    CHECK(HttpClient(sidecar->port()).post("/orders", kOrder, order_headers(tenant, unique("key"))).status == 201);
    CHECK(sidecar->log().find("upstream.tls.verify is false") != std::string::npos);
    CHECK(calls_for(backend, tenant).size() == 3);
  }
}

// ------------------------------------------------------------------------------ JWT

namespace {

struct Issuer {
  KeyPair rsa = KeyPair::rsa(2048);
  KeyPair ec = KeyPair::ec("P-256");
  KeyPair rotated = KeyPair::ec("P-256");

  std::string jwks() const { return idem::test::jwks({rsa.public_jwk("rsa-1"), ec.public_jwk("ec-1")}); }

  static std::string claims(const std::string& tenant, std::int64_t exp_offset = 300,
                            const std::string& iss = "https://idp.example/", const std::string& aud = "orders-api") {
    return "{\"iss\":\"" + iss + "\",\"aud\":\"" + aud + "\",\"org\":\"" + tenant + "\",\"sub\":\"user-42\",\"exp\":" +
           std::to_string(idem::test::unix_now() + exp_offset) + "}";
  }
  std::string token(const std::string& tenant, std::string_view alg = "RS256", std::string_view kid = "rsa-1") const {
    const auto& key = alg == "ES256" ? ec : rsa;
    return idem::test::sign_jwt("{\"alg\":\"" + std::string(alg) + "\",\"kid\":\"" + std::string(kid) + "\"}",
                                claims(tenant), key, alg);
  }
};

std::string jwt_yaml(const std::string& jwks_file) {
  return "from: jwt\njwt:\n  jwks_file: \"" + jwks_file +
         "\"\n  issuers: [\"https://idp.example/\"]\n  audiences: [orders-api]\n  tenant_claim: org\n"
         "  principal_claim: sub\n  leeway: 0s\n";
}

Headers bearer(const std::string& token, const std::string& key = {}) {
  Headers h{{"Content-Type", "application/json"}, {"Authorization", "Bearer " + token}};
  if (!key.empty()) h.emplace_back("Idempotency-Key", key);
  return h;
}

}  // namespace

TEST_CASE("tenant.from jwt: the verified tenant and principal are what is recorded and what the backend receives") {
  Pki pki;
  Issuer idp;
  const auto jwks_file = pki.write("jwks.json", idp.jwks());
  World w([&](SidecarOptions& o) { o.tenant_extra_yaml = jwt_yaml(jwks_file); });

  const auto key = unique("key");
  const auto token = idp.token(w.tenant);
  const auto first = w.client->post("/orders", kOrder, bearer(token, key));
  REQUIRE(first.status == 201);
  const auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 1);
  CHECK(calls.front().header("X-Tenant-Id") == w.tenant);
  CHECK(calls.front().header("X-User-Id") == "user-42");
  CHECK(calls.front().header("Authorization") == "Bearer " + token);  // forwarded as sent
  CHECK(read_row(w.db, w.tenant, key)->state == "completed");
  // ES256 from the same tenant replays the record: same tenant, same principal.
  const auto replay = w.client->post("/orders", kOrder, bearer(idp.token(w.tenant, "ES256", "ec-1"), key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  // Pass-through requests are verified too: the backend reads the same header on them.
  CHECK(w.client->get("/health", bearer(idp.token(w.tenant))).status == 200);
  CHECK(calls_for(w.backend, w.tenant).size() == 2);
}

TEST_CASE("tenant.from jwt: every bad token and a client-sent tenant header are refused; nothing is forwarded") {
  Pki pki;
  Issuer idp;
  const auto jwks_file = pki.write("jwks.json", idp.jwks());
  World w([&](SidecarOptions& o) { o.tenant_extra_yaml = jwt_yaml(jwks_file); });
  const auto sign_rsa = [&](const std::string& header, const std::string& claims) {
    return idem::test::sign_jwt(header, claims, idp.rsa, "RS256");
  };
  const std::string rs_header = "{\"alg\":\"RS256\",\"kid\":\"rsa-1\"}";
  const KeyPair stranger = KeyPair::rsa(2048);
  struct Case {
    const char* what;
    Headers headers;
    int status;
    const char* code;
  };
  const auto key = unique("key");
  const std::vector<Case> cases = {
      {"no token", {{"Content-Type", "application/json"}, {"Idempotency-Key", key}}, 401, "token_missing"},
      {"bad signature", bearer(idem::test::sign_jwt(rs_header, Issuer::claims(w.tenant), stranger, "RS256"), key), 401,
       "token_invalid"},
      {"wrong issuer", bearer(sign_rsa(rs_header, Issuer::claims(w.tenant, 300, "https://evil.example/")), key), 401,
       "token_issuer_invalid"},
      {"wrong audience", bearer(sign_rsa(rs_header, Issuer::claims(w.tenant, 300, "https://idp.example/", "billing")), key),
       401, "token_audience_invalid"},
      {"expired", bearer(sign_rsa(rs_header, Issuer::claims(w.tenant, -5)), key), 401, "token_expired"},
      {"alg none", bearer(idem::test::unsigned_jwt("{\"alg\":\"none\",\"kid\":\"rsa-1\"}", Issuer::claims(w.tenant)), key),
       401, "token_invalid"},
      {"HS256 keyed with the public key",
       bearer(idem::test::unsigned_jwt("{\"alg\":\"HS256\",\"kid\":\"rsa-1\"}", Issuer::claims(w.tenant), "mac"), key), 401,
       "token_invalid"},
      {"unknown kid", bearer(sign_rsa("{\"alg\":\"RS256\",\"kid\":\"rsa-9\"}", Issuer::claims(w.tenant)), key), 401,
       "token_invalid"},
      {"a client tenant header with a valid token",
       [&] {
         auto h = bearer(idp.token(w.tenant), key);
         h.emplace_back("X-Tenant-Id", w.tenant);
         return h;
       }(),
       400, "identity_header_forbidden"},
      {"a client principal header", [&] {
         auto h = bearer(idp.token(w.tenant), key);
         h.emplace_back("X-User-Id", "someone-else");
         return h;
       }(),
       400, "identity_header_forbidden"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const auto res = w.client->post("/orders", kOrder, c.headers);
    CHECK(res.status == c.status);
    CHECK(problem_code(res) == c.code);
    if (c.status == 401) CHECK(res.header("WWW-Authenticate").value_or("").rfind("Bearer realm=\"idemproxy\"", 0) == 0);
  }
  // Nothing reached the backend and nothing was claimed, under the token's tenant or any.
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
  // A pass-through request without a token is refused as well.
  CHECK(problem_code(w.client->get("/health")) == "token_missing");
  CHECK(w.calls().empty());
}

TEST_CASE("tenant.from jwt: SIGHUP reads the JWKS again; an unusable one keeps the keys in use") {
  Pki pki;
  Issuer idp;
  const auto jwks_file = pki.write("jwks.json", idp.jwks());
  World w([&](SidecarOptions& o) {
    o.tenant_extra_yaml = jwt_yaml(jwks_file);
    o.log_level = "info";
  });
  const auto rotated_token = idem::test::sign_jwt("{\"alg\":\"ES256\",\"kid\":\"ec-2\"}", Issuer::claims(w.tenant),
                                                  idp.rotated, "ES256");
  CHECK(problem_code(w.client->post("/orders", kOrder, bearer(rotated_token, unique("key")))) == "token_invalid");

  // The identity provider adds its next key; the operator (or a sync job) rewrites the file.
  pki.write("jwks.json", idem::test::jwks({idp.rsa.public_jwk("rsa-1"), idp.rotated.public_jwk("ec-2")}));
  w.sidecar->signal(SIGHUP);
  w.sidecar->wait_for_log("configuration reloaded");
  CHECK(w.client->post("/orders", kOrder, bearer(rotated_token, unique("key"))).status == 201);
  CHECK(problem_code(w.client->post("/orders", kOrder, bearer(idp.token(w.tenant, "ES256", "ec-1"), unique("key")))) ==
        "token_invalid");  // the retired key no longer verifies

  pki.write("jwks.json", "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"broken\"}]}");
  w.sidecar->signal(SIGHUP);
  w.sidecar->wait_for_log("reload refused");
  CHECK(w.sidecar->log().find("tenant.jwt.jwks_file") != std::string::npos);
  CHECK(w.client->post("/orders", kOrder, bearer(rotated_token, unique("key"))).status == 201);
  CHECK(calls_for(w.backend, w.tenant).size() == 2);
}

// ------------------------------------------------------------------------------ mTLS

TEST_CASE("tenant.from mtls: the client certificate's URI SAN names the tenant; no certificate, no request") {
  Pki pki;
  const CertificateAuthority clients("client CA");
  const auto clients_file = pki.write("clients.pem", clients.cert_pem());
  const auto server = pki.issue("server");
  World w([&](SidecarOptions& o) {
    o.extra_yaml = tls_yaml(server, clients_file);
    o.tenant_extra_yaml = "from: mtls\nmtls:\n  uri_prefix: \"spiffe://orders.example/tenant/\"\n";
  });
  CertificateOptions web;
  web.server = false;
  web.dns.clear();
  web.ips.clear();
  web.uris = {"spiffe://orders.example/tenant/" + w.tenant + "/client/web"};
  const auto web_cert = pki.issue("web", web, &clients);

  const auto key = unique("key");
  const auto ok = curl(pki, w.sidecar->port(), "/orders",
                       [&] {
                         auto a = order_args(key);
                         a.insert(a.end(), {"--cert", web_cert.cert_file, "--key", web_cert.key_file});
                         return a;
                       }());
  INFO(ok.output);
  CHECK(ok.status == 201);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 1);
  CHECK(calls.front().header("X-User-Id") == web.uris.front());
  CHECK(read_row(w.db, w.tenant, key)->state == "completed");

  // No client certificate: the handshake fails (curl exit 35 or 56, by TLS version).
  const auto anonymous = curl(pki, w.sidecar->port(), "/orders", order_args(unique("key")));
  CHECK(anonymous.exit_code != 0);
  CHECK(anonymous.status == 0);
  // A certificate without a URI under the prefix: 401, nothing forwarded.
  CertificateOptions nameless = web;
  nameless.uris = {"spiffe://orders.example/service/web"};
  TlsClientOptions o = trusting(pki);
  const auto issued = clients.issue(nameless);
  o.cert_pem = issued.cert_pem;
  o.key_pem = issued.key_pem;
  TlsClient client(w.sidecar->port(), o);
  REQUIRE_MESSAGE(client.connected(), client.handshake_error().value_or(""));
  const auto refused = client.request("POST", "/orders", {{"Content-Type", "application/json"}, {"Idempotency-Key", key}},
                                      kOrder);
  CHECK(refused.status == 401);
  CHECK(problem_code(refused) == "certificate_tenant_invalid");
  // A valid certificate with a client-sent tenant header: refused.
  const auto forged = curl(pki, w.sidecar->port(), "/orders",
                           [&] {
                             auto a = order_args(unique("key"), {{"X-Tenant-Id", "other-tenant"}});
                             a.insert(a.end(), {"--cert", web_cert.cert_file, "--key", web_cert.key_file});
                             return a;
                           }());
  CHECK(forged.status == 400);
  CHECK(forged.body.find("identity_header_forbidden") != std::string::npos);
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  CHECK(w.calls().size() == 1);
}
