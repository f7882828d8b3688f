// The migration files as the migrator reads them (pure: no database). Every embedded
// migration must parse, and every step of it must be online: this is where the upgrade
// rule of docs/operations.md is enforced for each future migration.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "store/migration_script.hpp"
#include "store/migrations.hpp"

using namespace idem;
using namespace idem::store;

namespace {

MigrationScript parse(std::string_view sql, int version = 9) {
  return parse_migration(EmbeddedMigration{version, "t", sql});
}

std::string parse_error(std::string_view sql) {
  try {
    parse(sql);
  } catch (const MigrationSyntaxError& e) {
    return e.what();
  }
  return "";
}

constexpr std::string_view kHeader =
    "-- idemproxy:compatible-from 8\nSET lock_timeout = '100ms';\n";

}  // namespace

TEST_CASE("split_sql: semicolons inside quotes, dollar quotes and comments do not split") {
  const auto parts = split_sql(
      "SELECT 'a;b', E'it\\'s;', \"we;ird\" FROM t; -- a; comment\n"
      "CREATE FUNCTION f() RETURNS int AS $body$ BEGIN RETURN 1; END $body$ LANGUAGE plpgsql;\n"
      "/* outer /* nested; */ still; */ UPDATE t SET a = $1 WHERE b = $2;\n"
      "DO $$ BEGIN PERFORM 1; END $$;\n"
      "-- only a comment;\n");
  REQUIRE(parts.size() == 4);
  CHECK(parts[0] == "SELECT 'a;b', E'it\\'s;', \"we;ird\" FROM t");
  CHECK(parts[1].find("RETURN 1; END $body$ LANGUAGE plpgsql") != std::string::npos);
  CHECK(parts[2].find("UPDATE t SET a = $1 WHERE b = $2") != std::string::npos);
  CHECK(parts[3] == "DO $$ BEGIN PERFORM 1; END $$");
}

TEST_CASE("normalize_sql: comments out, quoted text as placeholders, upper case") {
  CHECK(normalize_sql("alter  table\n t -- x\n add column c text default 'a;b'") ==
        "ALTER TABLE T ADD COLUMN C TEXT DEFAULT '?'");
  CHECK(normalize_sql("create function f() as $$ select 1 $$") == "CREATE FUNCTION F() AS $$?$$");
  CHECK(compact_sql("ALTER TABLE idempotency_requests\n  ADD COLUMN x text") ==
        "ALTER TABLE idempotency_requests ADD COLUMN x text");
}

TEST_CASE("every embedded migration parses, and every step of it is online") {
  for (const auto& m : embedded_migrations()) {
    INFO(migration_label(m));
    const auto script = parse_migration(m);
    CHECK(script.compatible_from >= 1);
    CHECK(script.compatible_from <= m.version);
    CHECK_FALSE(script.steps.empty());
    // A lock_timeout bounds every wait of every step (the migrator retries past it).
    bool bounded = false;
    for (const auto& s : script.preamble) bounded |= normalize_sql(s).starts_with("SET LOCK_TIMEOUT");
    CHECK(bounded);
    for (const auto& c : script.supersedes) CHECK(c != migration_checksum(m));
    for (const auto& c : classify_script(script)) {
      INFO("step " << c.step + 1 << ": " << c.lock.what);
      CHECK(c.lock.online);
    }
  }
}

TEST_CASE("the upgrade check's test migrations parse and are online; only the incompatible one refuses this release") {
  namespace fs = std::filesystem;
  const int latest = embedded_migrations().back().version;
  int seen = 0;
  for (const auto& dir : fs::directory_iterator(IDEM_UPGRADE_MIGRATIONS_DIR)) {
    for (const auto& file : fs::directory_iterator(dir.path())) {
      std::ifstream in(file.path(), std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      const std::string sql = text.str();
      INFO(file.path().string());
      const int version = std::stoi(file.path().filename().string().substr(0, 4));
      CHECK(version > latest);
      const auto script = parse_migration(EmbeddedMigration{version, "test", sql});
      for (const auto& c : classify_script(script)) CHECK(c.lock.online);
      // The compatible one allows exactly this checkout's schema: move its line when a
      // migration is added.
      const bool incompatible = dir.path().filename() == "incompatible";
      CHECK(script.compatible_from == (incompatible ? version : latest));
      ++seen;
    }
  }
  CHECK(seen == 2);
}

TEST_CASE("parse_migration: directives, preamble and steps") {
  const auto s = parse(std::string(kHeader) +
                       "-- idemproxy:supersedes " + std::string(64, 'a') + "\n"
                       "SET statement_timeout = '1min';\n"
                       "-- idemproxy:step transaction\nBEGIN;\nALTER TABLE t ADD COLUMN IF NOT EXISTS c text;\nCOMMIT;\n"
                       "-- idemproxy:step backfill t 64\n"
                       "UPDATE t SET c = 'x' WHERE ctid >= $1::tid AND ctid < $2::tid AND c IS NULL;\n"
                       "-- idemproxy:step index t_c_idx\nSET lock_timeout = '10min';\n"
                       "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c_idx ON t (c);\n");
  CHECK(s.compatible_from == 8);
  REQUIRE(s.supersedes.size() == 1);
  CHECK(s.preamble.size() == 2);
  REQUIRE(s.steps.size() == 3);
  CHECK(s.steps[0].kind == StepKind::transaction);
  CHECK(s.steps[0].statements.size() == 3);
  CHECK(s.steps[1].kind == StepKind::backfill);
  CHECK(s.steps[1].table == "t");
  CHECK(s.steps[1].pages == 64);
  CHECK(s.steps[2].kind == StepKind::index);
  CHECK(s.steps[2].index == "t_c_idx");
  CHECK(s.steps[2].statements.size() == 2);
}

TEST_CASE("parse_migration: refuses what the migrator could not run as written") {
  const std::string tx = "-- idemproxy:step transaction\nBEGIN;\nSELECT 1;\nCOMMIT;\n";
  CHECK(parse_error("SET lock_timeout = '1s';\n" + tx).find("compatible-from") != std::string::npos);
  CHECK(parse_error("-- idemproxy:compatible-from 10\n" + tx).find("compatible-from") != std::string::npos);
  CHECK(parse_error(std::string(kHeader)).find("at least one") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "SELECT 1;\n" + tx).find("only SET") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step sometimes\n").find("unknown step") !=
        std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step transaction\nSELECT 1;\n")
            .find("BEGIN") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "-- idemproxy:step transaction\nBEGIN;\nCREATE INDEX CONCURRENTLY i ON t (a);\nCOMMIT;\n")
            .find("CONCURRENTLY") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step backfill t 10\nUPDATE t SET a = 1;\n")
            .find("$1") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step backfill t 0\nUPDATE t SET a = $1 WHERE $2;\n")
            .find("pages") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "-- idemproxy:step index a_idx\nCREATE INDEX CONCURRENTLY IF NOT EXISTS b_idx ON t (a);\n")
            .find("another index") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step index a_idx\nCREATE INDEX a_idx ON t (a);\n")
            .find("CONCURRENTLY") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + tx + "-- idemproxy:supersedes " + std::string(64, 'b') + "\n")
            .find("before the first step") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:supersedes abc\n" + tx).find("SHA-256") !=
        std::string::npos);
  // The message names the file and the line.
  CHECK(parse_error(std::string(kHeader) + "-- idemproxy:step sometimes\n").find("0009_t, line 3") !=
        std::string::npos);
}

TEST_CASE("classify_statement: what blocks claims while it scans or rewrites") {
  const std::vector<std::string> none;
  const auto online = [&](std::string_view sql) { return classify_statement(sql, none).online; };
  // The two first texts this release rewrote (issue: 27.7 s and 1.3 s under the lock).
  CHECK_FALSE(online("ALTER TABLE r ADD COLUMN f bigint NOT NULL DEFAULT nextval('s')"));
  CHECK_FALSE(online("ALTER TABLE r ADD COLUMN t text CONSTRAINT c CHECK (t ~ '^x$')"));
  CHECK_FALSE(online("CREATE INDEX i ON r (a)"));
  CHECK_FALSE(online("ALTER TABLE r ADD CONSTRAINT c CHECK (a > 0)"));
  CHECK_FALSE(online("ALTER TABLE r ALTER COLUMN a TYPE bigint"));
  CHECK_FALSE(online("VACUUM FULL r"));
  CHECK(online("ALTER TABLE r ADD COLUMN IF NOT EXISTS f bigint"));
  CHECK(online("ALTER TABLE r ADD CONSTRAINT c CHECK (a > 0) NOT VALID"));
  CHECK(online("ALTER TABLE r VALIDATE CONSTRAINT c"));
  CHECK(online("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON r (a)"));
  CHECK(online("UPDATE r SET a = 1 WHERE ctid >= $1::tid AND ctid < $2::tid"));
  const auto lock = classify_statement("ALTER TABLE idempotency_requests ADD COLUMN x text", none);
  CHECK(lock.lock == "ACCESS EXCLUSIVE");
  CHECK(lock.table == "idempotency_requests");
  CHECK(lock.blocks_claims);
  // Anything on a table created by the same migration is online: nobody uses it yet.
  CHECK(classify_statement("CREATE INDEX i ON fresh (a)", {"FRESH"}).online);
  const auto script = parse(std::string(kHeader) +
                            "-- idemproxy:step transaction\nBEGIN;\nCREATE TABLE fresh (a int);\n"
                            "CREATE INDEX fresh_a ON fresh (a);\nCOMMIT;\n");
  for (const auto& c : classify_script(script)) CHECK(c.lock.online);
}

TEST_CASE("compare_schema: which databases a binary may serve") {
  static const std::string one =
      "-- idemproxy:compatible-from 1\n-- idemproxy:step transaction\nBEGIN;\nCOMMIT;\n";
  static const std::string two = "-- idemproxy:compatible-from 1\n-- idemproxy:supersedes " +
                                 std::string(64, 'e') +
                                 "\n-- idemproxy:step transaction\nBEGIN;\nCOMMIT;\n";
  const std::vector<EmbeddedMigration> known = {{1, "one", one}, {2, "two", two}};
  std::vector<AppliedMigration> applied;
  for (const auto& m : known) applied.push_back({m.version, migration_checksum(m), 1, std::string(m.name)});

  auto c = compare_schema(applied, known);
  CHECK(c.status == SchemaStatus::current);
  CHECK(c.binary_version == 2);
  CHECK(c.database_version == 2);

  CHECK(compare_schema({applied[0]}, known).status == SchemaStatus::behind);

  // An earlier text of migration 2 (the one it supersedes) is as good as its own.
  auto earlier = applied;
  earlier[1].checksum = std::string(64, 'e');
  CHECK(compare_schema(earlier, known).status == SchemaStatus::current);
  earlier[1].checksum = std::string(64, 'f');
  CHECK(compare_schema(earlier, known).status == SchemaStatus::mismatch);

  // Newer migrations: served when every one of them allows schema 2.
  auto newer = applied;
  newer.push_back({3, "x", 2, "add_column"});
  newer.push_back({4, "y", 1, "add_index"});
  c = compare_schema(newer, known);
  CHECK(c.status == SchemaStatus::newer_compatible);
  CHECK(c.database_version == 4);
  CHECK(c.required_version == 2);
  CHECK(c.detail.find("0004_add_index") != std::string::npos);

  newer.push_back({5, "z", 3, "contract"});
  c = compare_schema(newer, known);
  CHECK(c.status == SchemaStatus::incompatible);
  CHECK(c.required_version == 3);
  CHECK(c.detail.find("schema 3 or later") != std::string::npos);

  // A row written before the rule (no compatible_from) needs a binary that embeds it.
  auto legacy = applied;
  legacy.push_back({3, "x", std::nullopt, "older_rule"});
  CHECK(compare_schema(legacy, known).status == SchemaStatus::incompatible);

  // A gap this binary should know: another branch's migration.
  std::vector<AppliedMigration> gap = {applied[0], {2, "other", 1, "elsewhere"}};
  CHECK(compare_schema(gap, known).status == SchemaStatus::mismatch);
}
