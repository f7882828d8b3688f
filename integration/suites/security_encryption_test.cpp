// Encryption at rest, against PostgreSQL: a stored row's body and headers hold no
// plaintext, a key rotation keeps old records replayable, a sealed answer copied to
// another record does not open, a retired key's records are refused, and the admin API
// still describes records.
#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

std::string hex_of(std::string_view s) {
  std::string out;
  idem::text::append_hex(out, s);
  return out;
}

std::string encryption_yaml(const std::vector<std::pair<std::string, std::filesystem::path>>& keys,
                            const std::string& active) {
  std::string y = "encryption:\n  keys:\n";
  for (const auto& [id, file] : keys) y += "    - {id: " + id + ", file: \"" + file.string() + "\"}\n";
  return y + "  active: " + active + "\nreplay_cache:\n  enabled: false\n";
}

// The stored row, as PostgreSQL holds it.
struct RawRow {
  bool body_has(const std::string& needle) const { return body_hex.find(hex_of(needle)) != std::string::npos; }
  std::string body_hex;  // encode(response_body, 'hex')
  std::string headers;   // response_headers::text
};

RawRow raw_row(Db& db, const std::string& tenant, const std::string& key) {
  auto rows = db.query("SELECT encode(response_body, 'hex'), response_headers::text FROM idempotency_requests "
                       "WHERE tenant_id = $1 AND idempotency_key = $2",
                       {tenant, key});
  REQUIRE(rows.size() == 1);
  return {rows[0][0].value_or(""), rows[0][1].value_or("")};
}

// The key id a sealed body names: after the 8-byte magic, the version and the id's length.
std::string sealed_key_id(const RawRow& r) {
  REQUIRE(r.body_hex.size() > 20);
  REQUIRE(r.body_hex.substr(0, 16) == hex_of(std::string_view("\0IDEMENC", 8)));
  const auto len = std::stoi(r.body_hex.substr(18, 2), nullptr, 16);
  std::string id;
  for (int i = 0; i < len; ++i) {
    id += static_cast<char>(std::stoi(r.body_hex.substr(20 + 2 * static_cast<std::size_t>(i), 2), nullptr, 16));
  }
  return id;
}

// The keys are the process's: a reload keeps them (and says so), a restart applies them.
void restart_with(Sidecar& sidecar, const std::string& yaml) {
  sidecar.reload(yaml);
  sidecar.wait_for_log("reload: encryption changed; it applies only after a restart");
  sidecar.restart();
}

}  // namespace

TEST_CASE("encryption at rest: no plaintext stored, rotation, copied rows refused") {
  TestBackend backend;
  AdminPort admin;
  TempDir dir("keys");
  const auto k1 = dir.write_file("k1", std::string(64, 'a') + "\n");
  const auto k2 = dir.write_file("k2", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n");
  auto o = options_for(backend);
  o.log_level = "info";
  o.admin_listen = admin.listen();
  o.extra_yaml = encryption_yaml({{"k1", k1}}, "k1");
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  Db db(database_url());

  const auto tenant = unique("tenant-PLAIN");
  const auto marker = unique("LOCATIONMARK");
  const std::string body = R"({"customer_id":"c-1","amount":1000})";
  auto post = [&](const std::string& key) {
    return client.post("/orders", body,
                       order_headers(tenant, key, {{"X-Test-Header-Hex", hex_of("Location: /orders/" + marker)}}));
  };
  const auto first = post("key-a");
  REQUIRE(first.status == 201);
  CHECK(first.header("Location") == "/orders/" + marker);
  CHECK(first.body.find(tenant) != std::string::npos);  // the backend's body names the tenant

  // PostgreSQL holds neither the body (which names the tenant) nor the replay headers.
  auto a = raw_row(db, tenant, "key-a");
  CHECK_FALSE(a.body_has(tenant));
  CHECK_FALSE(a.body_has("order_id"));
  CHECK(a.headers.find(marker) == std::string::npos);
  CHECK(a.headers.find("Location") == std::string::npos);
  CHECK(a.headers.find(":sealed") != std::string::npos);
  CHECK(sealed_key_id(a) == "k1");

  // Replays are exact, from PostgreSQL (the replay cache is off here).
  auto replay = post("key-a");
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);
  CHECK(replay.header("Location") == "/orders/" + marker);
  // The admin API describes the record in clear (its sizes and header names).
  {
    HttpClient ac(admin.port);
    auto rec = ac.get(record_path(tenant, "POST /orders", "key-a"));
    REQUIRE(rec.status == 200);
    const auto j = boost::json::parse(rec.body).as_object();
    CHECK(j.at("response_body_bytes").as_int64() == static_cast<std::int64_t>(first.body.size()));
    CHECK(j.at("replay_header_names").as_array().size() >= 1);
  }

  // Rotation: k2 becomes active, k1 stays readable.
  restart_with(sidecar, sidecar.config().substr(0, sidecar.config().find("encryption:")) +
                            encryption_yaml({{"k1", k1}, {"k2", k2}}, "k2"));
  HttpClient after(sidecar.port());
  auto old_replay = after.post("/orders", body, order_headers(tenant, "key-a"));
  CHECK(old_replay.header("Idempotent-Replayed") == "true");
  CHECK(old_replay.body == first.body);
  auto b_res = after.post("/orders", body,
                          order_headers(tenant, "key-b", {{"X-Test-Header-Hex", hex_of("Location: /orders/" + marker)}}));
  REQUIRE(b_res.status == 201);
  auto b = raw_row(db, tenant, "key-b");
  CHECK(sealed_key_id(b) == "k2");
  CHECK_FALSE(b.body_has(tenant));
  CHECK(calls_for(backend, tenant).size() == 2);

  // A sealed answer copied to another record of the same tenant does not open: 503, and
  // nothing of it reaches the client.
  CHECK(db.exec("UPDATE idempotency_requests d SET response_body = s.response_body, "
                   "response_headers = s.response_headers FROM idempotency_requests s "
                   "WHERE d.tenant_id = $1 AND d.idempotency_key = 'key-b' "
                   "AND s.tenant_id = $1 AND s.idempotency_key = 'key-a'",
                   {tenant}) == 1);
  auto copied = after.post("/orders", body, order_headers(tenant, "key-b"));
  CHECK(copied.status == 503);
  CHECK(copied.body.find(tenant) == std::string::npos);
  CHECK(calls_for(backend, tenant).size() == 2);  // and nothing was forwarded again
  wait_until([&] { return sidecar.log().find("could not be decrypted: authentication failed") != std::string::npos; },
             10s, "the decryption failure in the log");

  // Retiring k1: its records are refused, never answered with something else.
  restart_with(sidecar, sidecar.config().substr(0, sidecar.config().find("encryption:")) +
                            encryption_yaml({{"k2", k2}}, "k2"));
  HttpClient retired(sidecar.port());
  CHECK(retired.post("/orders", body, order_headers(tenant, "key-a")).status == 503);
  wait_until([&] { return sidecar.log().find("key id that is not in encryption.keys") != std::string::npos; }, 10s,
             "the unknown key id in the log");
}

TEST_CASE("encryption at rest: an unusable key file is refused at start and by check-config") {
  TempDir dir("keys");
  const auto bad = dir.write_file("bad", "not a key\n");
  const auto cfg = dir.write_file("c.yaml", "listen: \"127.0.0.1:0\"\nupstream:\n  url: \"http://127.0.0.1:9\"\n"
                                            "database:\n  url: \"postgresql://u@127.0.0.1:1/db\"\n" +
                                                encryption_yaml({{"k1", bad}}, "k1"));
  auto r = run_idemproxy({"check-config", "--config", cfg.string()});
  CHECK(r.status.code() == 2);
  CHECK(r.output.find("encryption.keys[0].file") != std::string::npos);
  CHECK(r.output.find("not a key") == std::string::npos);  // never the file's content
  auto missing = dir.write_file("m.yaml", "listen: \"127.0.0.1:0\"\nupstream:\n  url: \"http://127.0.0.1:9\"\n"
                                          "database:\n  url: \"postgresql://u@127.0.0.1:1/db\"\n" +
                                              encryption_yaml({{"k1", dir.path() / "absent"}}, "k1"));
  CHECK(run_idemproxy({"check-config", "--config", missing.string()}).status.code() == 2);
}
