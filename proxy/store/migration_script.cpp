#include "store/migration_script.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>

#include "store/migrations.hpp"

namespace idem::store {

std::string_view to_string(StepKind kind) noexcept {
  switch (kind) {
    case StepKind::transaction: return "transaction";
    case StepKind::backfill: return "backfill";
    case StepKind::index: return "index";
    case StepKind::drop_index: return "drop-index";
    case StepKind::storage: return "storage";
  }
  return "?";
}

namespace {

// One pass over SQL text that knows PostgreSQL's lexical regions. `code(c)` sees every
// character outside comments and quoted text; `quoted(text)` every quoted region whole
// (string, E-string, quoted identifier, dollar-quoted body) with its delimiters;
// `comment()` marks where a comment was; `end()` each statement-ending semicolon.
template <class Code, class Quoted, class Comment, class End>
void scan_sql(std::string_view s, Code code, Quoted quoted, Comment comment, End end) {
  std::size_t i = 0;
  const auto n = s.size();
  while (i < n) {
    const char c = s[i];
    if (c == '-' && i + 1 < n && s[i + 1] == '-') {
      while (i < n && s[i] != '\n') ++i;
      comment();
      continue;
    }
    if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      // Block comments nest in PostgreSQL.
      int depth = 0;
      do {
        if (s.compare(i, 2, "/*") == 0) { ++depth; i += 2; }
        else if (s.compare(i, 2, "*/") == 0) { --depth; i += 2; }
        else ++i;
      } while (depth > 0 && i < n);
      comment();
      continue;
    }
    if (c == '\'' || c == '"') {
      // E'...' strings take backslash escapes; standard strings and identifiers double
      // their quote.
      const bool escapes = c == '\'' && i > 0 && (s[i - 1] == 'E' || s[i - 1] == 'e') &&
                           (i < 2 || !(std::isalnum(static_cast<unsigned char>(s[i - 2])) ||
                                       s[i - 2] == '_'));
      const std::size_t start = i++;
      while (i < n) {
        if (escapes && s[i] == '\\' && i + 1 < n) { i += 2; continue; }
        if (s[i] == c) {
          if (i + 1 < n && s[i + 1] == c) { i += 2; continue; }
          ++i;
          break;
        }
        ++i;
      }
      quoted(s.substr(start, i - start));
      continue;
    }
    if (c == '$' && (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) ||
                                 s[i - 1] == '_'))) {
      // $tag$ ... $tag$ (the tag may be empty); $1 is a parameter, not a quote.
      std::size_t j = i + 1;
      if (j < n && !std::isdigit(static_cast<unsigned char>(s[j]))) {
        while (j < n && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        if (j < n && s[j] == '$') {
          const std::string_view tag = s.substr(i, j - i + 1);
          const auto close = s.find(tag, j + 1);
          const std::size_t stop = close == std::string_view::npos ? n : close + tag.size();
          quoted(s.substr(i, stop - i));
          i = stop;
          continue;
        }
      }
    }
    if (c == ';') {
      end(i);
      ++i;
      continue;
    }
    code(c);
    ++i;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view normalized, std::string_view prefix) {
  return normalized.substr(0, prefix.size()) == prefix &&
         (normalized.size() == prefix.size() || normalized[prefix.size()] == ' ' ||
          normalized[prefix.size()] == '(');
}

bool contains(std::string_view normalized, std::string_view what) {
  return normalized.find(what) != std::string_view::npos;
}

// The word after `keyword ` in a normalized statement (a table or index name), without
// IF [NOT] EXISTS, ONLY or a schema-qualified prefix's quotes.
std::string word_after(std::string_view normalized, std::string_view keyword) {
  auto at = normalized.find(keyword);
  if (at == std::string_view::npos) return {};
  std::string_view rest = trim(normalized.substr(at + keyword.size()));
  for (std::string_view skip : {"IF NOT EXISTS ", "IF EXISTS ", "ONLY "}) {
    if (rest.substr(0, skip.size()) == skip) rest.remove_prefix(skip.size());
  }
  const auto stop = rest.find_first_of(" (;");
  return std::string(rest.substr(0, stop));
}

[[noreturn]] void fail(const EmbeddedMigration& m, int line, const std::string& what) {
  std::string v = std::to_string(m.version);
  if (v.size() < 4) v.insert(0, 4 - v.size(), '0');
  throw MigrationSyntaxError("migration " + v + "_" + std::string(m.name) + ", line " +
                             std::to_string(line) + ": " + what);
}

bool is_set(std::string_view statement) { return starts_with(normalize_sql(statement), "SET"); }

// Checks a step's statements against its kind, and fills in what the kind needs.
void check_step(const EmbeddedMigration& m, MigrationStep& step) {
  step.statements = split_sql(step.sql);
  if (step.statements.empty()) fail(m, step.line, "the step has no statement");
  if (step.kind == StepKind::transaction) {
    const auto first = normalize_sql(step.statements.front());
    const auto last = normalize_sql(step.statements.back());
    if (first != "BEGIN" || (last != "COMMIT" && last != "END")) {
      fail(m, step.line, "a transaction step starts with BEGIN; and ends with COMMIT;");
    }
    for (std::size_t i = 1; i + 1 < step.statements.size(); ++i) {
      const auto s = normalize_sql(step.statements[i]);
      if (s == "BEGIN" || s == "COMMIT" || s == "END" || s == "ROLLBACK" ||
          contains(s, "CONCURRENTLY")) {
        fail(m, step.line, "a transaction step holds one transaction, and nothing that "
                           "cannot run inside one (CONCURRENTLY: an index step)");
      }
    }
    return;
  }
  // backfill, index, drop-index and storage: SETs, then exactly one statement.
  std::size_t main = 0;
  while (main < step.statements.size() && is_set(step.statements[main])) ++main;
  if (main + 1 != step.statements.size()) {
    fail(m, step.line, std::string("a ") + std::string(to_string(step.kind)) +
                           " step holds SET statements and then exactly one statement");
  }
  const auto s = normalize_sql(step.statements[main]);
  if (step.kind == StepKind::backfill) {
    if (!starts_with(s, "UPDATE") || !contains(s, "$1") || !contains(s, "$2")) {
      fail(m, step.line, "a backfill step is one UPDATE that takes the page range as $1 and $2");
    }
  } else if (step.kind == StepKind::storage) {
    // Storage parameters alone (SHARE UPDATE EXCLUSIVE): anything more in the statement
    // would take the lock of that clause instead.
    std::string body = s;
    while (!body.empty() && (body.back() == ';' || body.back() == ' ')) body.pop_back();
    const std::string head = "ALTER TABLE " + normalize_sql(step.table) + " SET (";
    if (body.compare(0, head.size(), head) != 0 || body.find(')') != body.size() - 1) {
      fail(m, step.line, "a storage step is one ALTER TABLE " + step.table +
                             " SET (parameter = value, ...) and nothing else");
    }
  } else if (step.kind == StepKind::drop_index) {
    if (!starts_with(s, "DROP INDEX CONCURRENTLY IF EXISTS")) {
      fail(m, step.line, "a drop-index step is one DROP INDEX CONCURRENTLY IF EXISTS");
    } else if (word_after(s, " EXISTS") != normalize_sql(step.index)) {
      fail(m, step.line, "the drop-index step names " + step.index + " but drops another index");
    }
  } else if (!starts_with(s, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") &&
             !starts_with(s, "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS")) {
    fail(m, step.line, "an index step is one CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS");
  } else if (word_after(s, " EXISTS") != normalize_sql(step.index)) {
    fail(m, step.line, "the index step names " + step.index + " but creates another index");
  }
}

// "-- idemproxy:step backfill idempotency_requests 256" -> the step's kind and arguments.
MigrationStep parse_marker(const EmbeddedMigration& m, int line, std::string_view args) {
  MigrationStep step;
  step.line = line;
  std::vector<std::string_view> words;
  for (args = trim(args); !args.empty(); args = trim(args)) {
    const auto stop = std::min(args.find(' '), args.size());
    words.push_back(args.substr(0, stop));
    args.remove_prefix(stop);
  }
  if (words.empty()) fail(m, line, "idemproxy:step needs a kind");
  if (words[0] == "transaction" && words.size() == 1) {
    step.kind = StepKind::transaction;
  } else if (words[0] == "backfill" && words.size() == 3) {
    step.kind = StepKind::backfill;
    step.table = std::string(words[1]);
    const auto [p, ec] = std::from_chars(words[2].data(), words[2].data() + words[2].size(),
                                         step.pages);
    if (ec != std::errc{} || p != words[2].data() + words[2].size() || step.pages == 0 ||
        step.pages > 100000) {
      fail(m, line, "backfill pages must be a number from 1 to 100000");
    }
  } else if (words[0] == "storage" && words.size() == 2) {
    step.kind = StepKind::storage;
    step.table = std::string(words[1]);
  } else if ((words[0] == "index" || words[0] == "drop-index") && words.size() == 2) {
    step.kind = words[0] == "index" ? StepKind::index : StepKind::drop_index;
    step.index = std::string(words[1]);
  } else {
    fail(m, line, "unknown step: expected `transaction`, `backfill TABLE PAGES`, `index NAME`, "
                  "`drop-index NAME` or `storage TABLE`");
  }
  return step;
}

}  // namespace

std::vector<std::string> split_sql(std::string_view sql) {
  std::vector<std::string> out;
  std::size_t start = 0;
  const auto push = [&](std::size_t stop) {
    const auto piece = trim(sql.substr(start, stop - start));
    if (!normalize_sql(piece).empty()) out.emplace_back(piece);
    start = stop + 1;
  };
  scan_sql(sql, [](char) {}, [](std::string_view) {}, [] {}, push);
  push(sql.size());
  return out;
}

namespace {

std::string collapse_sql(std::string_view sql, bool upper) {
  std::string out;
  const auto cased = [upper](char c) {
    return upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
  };
  const auto space = [&] {
    if (!out.empty() && out.back() != ' ') out += ' ';
  };
  scan_sql(
      sql,
      [&](char c) {
        if (std::isspace(static_cast<unsigned char>(c))) {
          space();
        } else {
          out += cased(c);
        }
      },
      [&](std::string_view q) {
        if (q.front() == '"') {
          // A quoted identifier stays a name (upper-cased like the rest: a comparison
          // here is between our own files' names).
          for (char c : q.substr(1, q.size() >= 2 ? q.size() - 2 : 0)) out += cased(c);
        } else {
          out += q.front() == '$' ? "$$?$$" : "'?'";
        }
      },
      [&] { space(); }, [&](std::size_t) { out += ';'; });
  while (!out.empty() && out.back() == ' ') out.pop_back();
  while (!out.empty() && out.front() == ' ') out.erase(out.begin());
  return out;
}

}  // namespace

std::string normalize_sql(std::string_view sql) { return collapse_sql(sql, true); }
std::string compact_sql(std::string_view sql) { return collapse_sql(sql, false); }

MigrationScript parse_migration(const EmbeddedMigration& m) {
  MigrationScript script;
  bool have_compat = false;
  std::string preamble;
  MigrationStep* step = nullptr;
  int line_no = 0;
  std::string_view rest = m.sql;
  while (!rest.empty()) {
    ++line_no;
    const auto nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    const auto text = trim(line);
    constexpr std::string_view kDirective = "-- idemproxy:";
    if (text.substr(0, kDirective.size()) == kDirective) {
      const auto body = text.substr(kDirective.size());
      const auto sp = std::min(body.find(' '), body.size());
      const auto name = body.substr(0, sp);
      const auto value = trim(body.substr(sp));
      if (name == "step") {
        script.steps.push_back(parse_marker(m, line_no, value));
        step = &script.steps.back();
        continue;
      }
      if (step != nullptr) fail(m, line_no, "idemproxy:" + std::string(name) + " belongs before the first step");
      if (name == "compatible-from") {
        int v = 0;
        const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec != std::errc{} || p != value.data() + value.size() || v < 1 || v > m.version) {
          fail(m, line_no, "compatible-from must be a schema version from 1 to this migration's own");
        }
        script.compatible_from = v;
        have_compat = true;
      } else if (name == "supersedes") {
        if (value.size() != 64 || value.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
          fail(m, line_no, "supersedes takes the SHA-256 (64 lower-case hex digits) of an earlier text");
        }
        script.supersedes.emplace_back(value);
      } else if (name == "contract") {
        if (!value.empty()) fail(m, line_no, "idemproxy:contract takes no value");
        script.contract = true;
      } else {
        fail(m, line_no, "unknown directive idemproxy:" + std::string(name));
      }
      continue;
    }
    std::string& into = step ? step->sql : preamble;
    into.append(line);
    into += '\n';
  }
  if (!have_compat) fail(m, 1, "a migration declares `-- idemproxy:compatible-from N`");
  if (script.steps.empty()) fail(m, line_no, "a migration has at least one `-- idemproxy:step`");
  script.preamble = split_sql(preamble);
  for (const auto& s : script.preamble) {
    if (!is_set(s)) fail(m, 1, "before the first step only SET statements may stand");
  }
  for (auto& s : script.steps) {
    check_step(m, s);
    // Removing an index is the contract half of a change: the previous release may still
    // read through it, and its scans would turn into scans of the whole table.
    if (s.kind == StepKind::drop_index && !script.contract) {
      fail(m, s.line, "a drop-index step belongs in a contract migration (`-- idemproxy:contract`): "
                      "replicas of the previous release may still use the index");
    }
  }
  return script;
}

StatementLock classify_statement(std::string_view statement,
                                 const std::vector<std::string>& created) {
  const std::string s = normalize_sql(statement);
  const auto is_new = [&](std::string table) {
    std::transform(table.begin(), table.end(), table.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    return std::find(created.begin(), created.end(), table) != created.end();
  };
  StatementLock r;
  const auto on = [&](std::string lock, std::string table, bool blocks, bool online,
                      std::string what) {
    r.lock = std::move(lock);
    // Names are compared upper-cased; shown as the files spell them (lower case).
    std::transform(table.begin(), table.end(), table.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    r.table = std::move(table);
    r.blocks_claims = blocks;
    const bool fresh = !r.table.empty() && is_new(r.table);
    r.online = online || fresh;
    r.what = std::move(what);
    if (fresh) r.what += " (a table of this migration: nobody uses it yet)";
    return r;
  };
  if (s == "BEGIN" || s == "COMMIT" || s == "END" || starts_with(s, "SET")) {
    return on("none", "", false, true, "session or transaction control");
  }
  if (starts_with(s, "CREATE TABLE")) {
    const auto table = word_after(s, "CREATE TABLE");
    if (contains(s, " REFERENCES ")) {
      return on("SHARE ROW EXCLUSIVE", word_after(s, " REFERENCES"), true, true,
                "new table " + table + "; its foreign key locks the referenced table for a moment");
    }
    return on("none", "", false, true, "new table " + table);
  }
  if (starts_with(s, "CREATE SEQUENCE") || starts_with(s, "ALTER SEQUENCE")) {
    return on("none", "", false, true, "a sequence");
  }
  if (starts_with(s, "CREATE FUNCTION") || starts_with(s, "CREATE OR REPLACE FUNCTION")) {
    return on("none", "", false, true, "a function");
  }
  if (starts_with(s, "CREATE TRIGGER") || starts_with(s, "CREATE OR REPLACE TRIGGER")) {
    return on("SHARE ROW EXCLUSIVE", word_after(s, " ON "), true, true,
              "a trigger: writes wait for a moment");
  }
  if (starts_with(s, "CREATE INDEX") || starts_with(s, "CREATE UNIQUE INDEX")) {
    const auto table = word_after(s, " ON ");
    if (contains(s, " CONCURRENTLY ")) {
      return on("SHARE UPDATE EXCLUSIVE", table, false, true,
                "index built concurrently: reads and writes go on");
    }
    return on("SHARE", table, true, false, "index built under a lock that blocks writes");
  }
  if (starts_with(s, "UPDATE")) {
    const auto table = word_after(s, "UPDATE");
    return on("ROW EXCLUSIVE", table, false, true, "row locks, one batch at a time");
  }
  if (starts_with(s, "ALTER TABLE")) {
    const auto table = word_after(s, "ALTER TABLE");
    if (contains(s, " VALIDATE CONSTRAINT ")) {
      return on("SHARE UPDATE EXCLUSIVE", table, false, true,
                "validates a constraint: scans the table, reads and writes go on");
    }
    if ((contains(s, " SET (") || contains(s, " SET(")) && !contains(s, " ALTER COLUMN ")) {
      return on("SHARE UPDATE EXCLUSIVE", table, false, true, "storage parameters");
    }
    const bool add_column = contains(s, " ADD COLUMN ");
    if (add_column && (contains(s, " CHECK") || contains(s, " REFERENCES ") ||
                       contains(s, " UNIQUE") || contains(s, " PRIMARY KEY") ||
                       contains(s, " GENERATED "))) {
      return on("ACCESS EXCLUSIVE", table, true, false,
                "a column with a constraint: scans or rewrites the table under the lock");
    }
    if (add_column && contains(s, " DEFAULT ") &&
        (contains(s, "NEXTVAL(") || contains(s, "RANDOM(") || contains(s, "GEN_RANDOM_UUID(") ||
         contains(s, "CLOCK_TIMESTAMP("))) {
      return on("ACCESS EXCLUSIVE", table, true, false,
                "a column with a volatile default: rewrites the table under the lock");
    }
    if (contains(s, " TYPE ") || contains(s, " SET DATA TYPE ")) {
      return on("ACCESS EXCLUSIVE", table, true, false, "a type change: may rewrite the table");
    }
    if (contains(s, " ADD CONSTRAINT ") || contains(s, " ADD FOREIGN KEY") ||
        contains(s, " ADD CHECK")) {
      if (!contains(s, " NOT VALID")) {
        return on("ACCESS EXCLUSIVE", table, true, false,
                  "a constraint checked against every row under the lock (add it NOT VALID)");
      }
      return on("ACCESS EXCLUSIVE", table, true, true, "a constraint added NOT VALID: a moment");
    }
    if (contains(s, " SET NOT NULL")) {
      return on("ACCESS EXCLUSIVE", table, true, true,
                "NOT NULL: a moment when a valid CHECK (column IS NOT NULL) proves it, else a "
                "scan under the lock");
    }
    return on("ACCESS EXCLUSIVE", table, true, true, "a catalog change: a moment");
  }
  if (starts_with(s, "DROP INDEX")) {
    if (contains(s, " CONCURRENTLY ")) {
      return on("SHARE UPDATE EXCLUSIVE", word_after(s, "CONCURRENTLY"), false, true,
                "index dropped concurrently");
    }
    return on("ACCESS EXCLUSIVE", word_after(s, "DROP INDEX"), true, true,
              "index dropped: a moment");
  }
  if (starts_with(s, "COMMENT ON")) return on("SHARE UPDATE EXCLUSIVE", "", false, true, "a comment");
  return on("unknown", "", true, false, "not recognized: review its lock by hand");
}

std::vector<ClassifiedStatement> classify_script(const MigrationScript& script) {
  std::vector<ClassifiedStatement> out;
  std::vector<std::string> created;
  for (std::size_t i = 0; i < script.steps.size(); ++i) {
    for (const auto& st : script.steps[i].statements) {
      auto lock = classify_statement(st, created);
      const auto n = normalize_sql(st);
      if (starts_with(n, "CREATE TABLE")) created.push_back(word_after(n, "CREATE TABLE"));
      out.push_back({i, std::move(lock)});
    }
  }
  return out;
}

}  // namespace idem::store
