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

// The keys reload on SIGHUP: the `n`th reload of this process, applied.
void reload_with(Sidecar& sidecar, const std::string& yaml, std::size_t n) {
  sidecar.reload(yaml);
  sidecar.wait_for_log("configuration reloaded", n);
}

// The sidecar's YAML without its encryption section (encryption_yaml() comes last).
std::string without_encryption(const Sidecar& sidecar) {
  return sidecar.config().substr(0, sidecar.config().find("encryption:"));
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
  reload_with(sidecar, without_encryption(sidecar) + encryption_yaml({{"k1", k1}, {"k2", k2}}, "k2"), 1);
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
  reload_with(sidecar, without_encryption(sidecar) + encryption_yaml({{"k2", k2}}, "k2"), 2);
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

TEST_CASE("encryption keys reload on SIGHUP: new rows under the new active key, old rows still open, bad key sets refused") {
  TestBackend backend;
  TempDir dir("keys");
  const auto ka = dir.write_file("a.key", std::string(64, 'a') + "\n");
  const auto kb = dir.write_file("b.key", std::string(64, 'b') + "\n");
  auto o = options_for(backend);
  o.log_level = "info";
  o.extra_yaml = encryption_yaml({{"A", ka}}, "A");
  Sidecar sidecar(o);
  Db db(database_url());
  const auto tenant = unique("tenant-PLAIN");
  const auto marker = unique("LOCATIONMARK");
  const std::string body = R"({"customer_id":"c-1","amount":1000})";
  auto post = [&](const std::string& key) {
    HttpClient client(sidecar.port());
    return client.post("/orders", body,
                       order_headers(tenant, key, {{"X-Test-Header-Hex", hex_of("Location: /orders/" + marker + key)}}));
  };
  // Sealed under `id`, with nothing of the answer in clear.
  auto check_sealed = [&](const std::string& key, const std::string& id) {
    CAPTURE(key);
    const auto row = raw_row(db, tenant, key);
    CHECK(sealed_key_id(row) == id);
    CHECK_FALSE(row.body_has(tenant));
    CHECK_FALSE(row.body_has("order_id"));
    CHECK(row.headers.find(marker) == std::string::npos);
    CHECK(row.headers.find(":sealed") != std::string::npos);
  };
  // The replay is the first answer, byte for byte, read from PostgreSQL (no replay cache).
  auto check_replay = [&](const std::string& key, const HttpResponse& first) {
    CAPTURE(key);
    const auto again = post(key);
    CHECK(again.status == first.status);
    CHECK(again.header("Idempotent-Replayed") == "true");
    CHECK(again.body == first.body);
    CHECK(again.header("Location") == first.header("Location"));
    CHECK(again.header("Content-Type") == first.header("Content-Type"));
  };

  const auto a = post("key-a");
  REQUIRE(a.status == 201);
  CHECK(a.body.find(tenant) != std::string::npos);
  check_sealed("key-a", "A");

  // Rotation without a restart: B is added and made active.
  const auto pid = sidecar.process().pid();
  reload_with(sidecar, without_encryption(sidecar) + encryption_yaml({{"A", ka}, {"B", kb}}, "B"), 1);
  sidecar.wait_for_log("new records sealed with key B; keys listed to open records: 2");
  const auto b = post("key-b");
  REQUIRE(b.status == 201);
  check_sealed("key-b", "B");
  check_replay("key-a", a);
  check_replay("key-b", b);

  // Reloads to key sets that cannot be used: each refused, the running keys (A, B active)
  // stay, and the sidecar keeps serving and sealing with B.
  const auto good = without_encryption(sidecar) + encryption_yaml({{"A", ka}, {"B", kb}}, "B");
  const auto short_key = dir.write_file("short.key", std::string(62, 'c') + "\n");
  const std::vector<std::pair<std::string, std::string>> invalid = {
      {encryption_yaml({{"A", ka}, {"C", dir.path() / "absent.key"}}, "C"), "encryption.keys[1].file: cannot read"},
      {encryption_yaml({{"A", ka}, {"C", short_key}}, "C"), "must hold 32 bytes"},
      {encryption_yaml({{"A", ka}, {"B", kb}}, "C"), "encryption.active: 'C' is not the id"},
  };
  std::size_t refused = 0;
  for (const auto& [yaml, where] : invalid) {
    INFO(where);
    sidecar.reload(without_encryption(sidecar) + yaml);
    sidecar.wait_for_log("reload refused, keeping the running configuration", ++refused);
    CHECK(sidecar.log().find(where) != std::string::npos);
    CHECK(sidecar.log().find(std::string(62, 'c')) == std::string::npos);  // never a key's content
    const auto key = "key-after-" + std::to_string(refused);
    const auto res = post(key);
    REQUIRE(res.status == 201);
    check_sealed(key, "B");
    check_replay("key-a", a);
  }
  CHECK(sidecar.process().pid() == pid);  // one process throughout: no restart
  CHECK(calls_for(backend, tenant).size() == 2 + invalid.size());
  sidecar.reload(good);
  sidecar.wait_for_log("configuration reloaded", 2);
}
