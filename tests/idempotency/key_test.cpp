// Idempotency-Key parsing: every rule of key.hpp, table-driven.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <stdexcept>

#include "idempotency/key.hpp"

using idem::idempotency::KeyParse;
using idem::idempotency::KeyStatus;
using idem::idempotency::parse_key;

namespace {

KeyParse parse(const std::vector<std::string>& values, std::size_t max_length = 255) {
  std::vector<std::string_view> views(values.begin(), values.end());
  return parse_key(views, max_length);
}

struct KeyCase {
  const char* name;
  std::vector<std::string> values;
  KeyStatus status;
  std::string key;  // expected key when ok
};

}  // namespace

TEST_CASE("parse_key: table of accepted and refused values") {
  const std::vector<KeyCase> cases = {
      // presence and count
      {"no field", {}, KeyStatus::missing, ""},
      {"two fields", {"abc", "def"}, KeyStatus::invalid, ""},
      {"two equal fields", {"abc", "abc"}, KeyStatus::invalid, ""},
      {"two fields, one empty", {"abc", ""}, KeyStatus::invalid, ""},
      // bare and quoted mean the same
      {"bare", {"abc"}, KeyStatus::ok, "abc"},
      {"quoted", {"\"abc\""}, KeyStatus::ok, "abc"},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, KeyStatus::ok,
       "123e4567-e89b-12d3-a456-426614174000"},
      {"all visible punctuation bare", {"!#$%&'()*+-./:;<=>?@[\\]^_`{|}~"}, KeyStatus::ok,
       "!#$%&'()*+-./:;<=>?@[\\]^_`{|}~"},
      // OWS around the field value is not part of it
      {"leading/trailing spaces bare", {"  abc "}, KeyStatus::ok, "abc"},
      {"leading/trailing tabs", {"\tabc\t"}, KeyStatus::ok, "abc"},
      {"spaces around quoted", {" \"abc\"  "}, KeyStatus::ok, "abc"},
      // escapes
      {"escaped quote", {"\"a\\\"b\""}, KeyStatus::ok, "a\"b"},
      {"escaped backslash", {"\"a\\\\b\""}, KeyStatus::ok, "a\\b"},
      {"only escapes", {"\"\\\\\\\"\""}, KeyStatus::ok, "\\\""},
      {"other escape", {"\"a\\nb\""}, KeyStatus::invalid, ""},
      {"escaped letter", {"\"\\a\""}, KeyStatus::invalid, ""},
      {"backslash before end", {"\"abc\\\""}, KeyStatus::invalid, ""},
      {"lone backslash at end", {"\"abc\\"}, KeyStatus::invalid, ""},
      // quoting structure
      {"unterminated", {"\"abc"}, KeyStatus::invalid, ""},
      {"only a quote", {"\""}, KeyStatus::invalid, ""},
      {"parameters after string", {"\"abc\";a=1"}, KeyStatus::invalid, ""},
      {"text after string", {"\"abc\"def"}, KeyStatus::invalid, ""},
      {"list of strings", {"\"abc\", \"def\""}, KeyStatus::invalid, ""},
      {"comma inside quotes is fine", {"\"a,b\""}, KeyStatus::ok, "a,b"},
      {"quote inside bare value", {"ab\"c"}, KeyStatus::ok, "ab\"c"},
      {"semicolon in bare value is literal", {"abc;a=1"}, KeyStatus::ok, "abc;a=1"},
      // commas in bare values read as a list
      {"bare list", {"a,b"}, KeyStatus::invalid, ""},
      {"bare list with space", {"a, b"}, KeyStatus::invalid, ""},
      {"trailing comma", {"abc,"}, KeyStatus::invalid, ""},
      {"only comma", {","}, KeyStatus::invalid, ""},
      // empty
      {"empty", {""}, KeyStatus::invalid, ""},
      {"only spaces", {"   "}, KeyStatus::invalid, ""},
      {"empty quoted", {"\"\""}, KeyStatus::invalid, ""},
      {"empty quoted with spaces", {"  \"\" "}, KeyStatus::invalid, ""},
      // characters outside 0x21-0x7E, bare and quoted
      {"inner space bare", {"a b"}, KeyStatus::invalid, ""},
      {"inner space quoted", {"\"a b\""}, KeyStatus::invalid, ""},
      {"only a quoted space", {"\" \""}, KeyStatus::invalid, ""},
      {"leading space inside quotes", {"\" abc\""}, KeyStatus::invalid, ""},
      {"tab inside", {"a\tb"}, KeyStatus::invalid, ""},
      {"tab inside quotes", {"\"a\tb\""}, KeyStatus::invalid, ""},
      {"control char", {"a\x01" "b"}, KeyStatus::invalid, ""},
      {"DEL", {"a\x7f" "b"}, KeyStatus::invalid, ""},
      {"NUL", {std::string("a\0b", 3)}, KeyStatus::invalid, ""},
      {"CR LF", {"a\r\nb"}, KeyStatus::invalid, ""},
      {"UTF-8 e-acute", {"caf\xc3\xa9"}, KeyStatus::invalid, ""},
      {"UTF-8 in quotes", {"\"caf\xc3\xa9\""}, KeyStatus::invalid, ""},
      {"high byte", {"\xff"}, KeyStatus::invalid, ""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const KeyParse r = parse(c.values);
    CHECK(r.status == c.status);
    if (c.status == KeyStatus::ok) {
      CHECK(r.key == c.key);
      CHECK(r.reason.empty());
    }
    if (c.status == KeyStatus::invalid) CHECK_FALSE(r.reason.empty());
    if (c.status == KeyStatus::missing) CHECK(r.reason.empty());
  }
}

TEST_CASE("parse_key: bare and quoted forms name the same key") {
  for (const std::string k : {"a", "order-42", "x_y.z~1", "A:B/C"}) {
    CAPTURE(k);
    const auto bare = parse({k});
    const auto quoted = parse({"\"" + k + "\""});
    REQUIRE(bare.status == KeyStatus::ok);
    REQUIRE(quoted.status == KeyStatus::ok);
    CHECK(bare.key == quoted.key);
  }
}

TEST_CASE("parse_key: length limit applies after unquoting") {
  const std::size_t max = 255;
  const std::string exact(max, 'k');
  const std::string over(max + 1, 'k');

  CHECK(parse({exact}, max).status == KeyStatus::ok);
  CHECK(parse({exact}, max).key == exact);
  CHECK(parse({over}, max).status == KeyStatus::invalid);

  // The quotes do not count...
  CHECK(parse({"\"" + exact + "\""}, max).status == KeyStatus::ok);
  CHECK(parse({"\"" + over + "\""}, max).status == KeyStatus::invalid);
  // ...and an escape counts as the one character it stands for.
  const std::string escaped = "\"" + std::string(max - 1, 'k') + "\\\\\"";
  const auto r = parse({escaped}, max);
  REQUIRE(r.status == KeyStatus::ok);
  CHECK(r.key.size() == max);
  CHECK(parse({"\"" + std::string(max, 'k') + "\\\\\""}, max).status == KeyStatus::invalid);
  // OWS does not count either.
  CHECK(parse({"  " + exact + "  "}, max).status == KeyStatus::ok);

  CHECK(parse({"ab"}, 2).status == KeyStatus::ok);
  CHECK(parse({"abc"}, 2).status == KeyStatus::invalid);
  CHECK(parse({"a"}, 1).status == KeyStatus::ok);
  CHECK(parse({"a"}, 0).status == KeyStatus::invalid);
}

TEST_CASE("parse_key: reasons never echo the key") {
  const std::string secret = "SECRETKEY";
  const std::vector<std::vector<std::string>> bad = {
      {secret, secret},
      {secret + ",x"},
      {secret + " x"},
      {"\"" + secret},
      {"\"" + secret + "\\n\""},
      {"\"" + secret + "\";p=1"},
      {secret + "\x01"},
      {secret + std::string(300, 'x')},
  };
  for (const auto& values : bad) {
    const auto r = parse(values);
    REQUIRE(r.status == KeyStatus::invalid);
    CHECK(r.reason.find("SECRET") == std::string::npos);
    CHECK(r.key.empty());
  }
}

namespace {

using idem::idempotency::Json;
using idem::idempotency::KeySources;
using idem::idempotency::KeySpec;
using idem::idempotency::read_key;
using idem::settings::KeySettings;
using idem::settings::KeySource;

KeySpec body_spec(std::string pointer, std::size_t max_length = 16) {
  KeySettings s;
  s.from = KeySource::body;
  s.pointer = std::move(pointer);
  s.max_length = max_length;
  return KeySpec::compile(s);
}

KeySpec query_spec(std::string param) {
  KeySettings s;
  s.from = KeySource::query;
  s.param = std::move(param);
  s.max_length = 16;
  return KeySpec::compile(s);
}

KeyParse from_body(const KeySpec& spec, const std::string& json, std::vector<std::string> header = {}) {
  std::string why;
  const auto model = idem::idempotency::parse_json(json, &why);
  REQUIRE_MESSAGE(model.has_value(), why);
  const std::vector<std::string_view> views(header.begin(), header.end());
  KeySources in;
  in.header_values = views;
  in.body = &*model;
  return read_key(spec, in);
}

KeyParse from_query(const KeySpec& spec, std::string_view query, std::vector<std::string> header = {}) {
  const std::vector<std::string_view> views(header.begin(), header.end());
  KeySources in;
  in.header_values = views;
  in.query = query;
  return read_key(spec, in);
}

}  // namespace

TEST_CASE("read_key: a key in the body is a string member where key.pointer says") {
  const auto top = body_spec("/idempotency_key");
  CHECK(from_body(top, R"({"idempotency_key":"k-1","amount":1})").key == "k-1");
  CHECK(from_body(top, R"({"idempotency_key":"k-1"})").status == KeyStatus::ok);
  CHECK(from_body(top, R"({"amount":1})").status == KeyStatus::missing);
  CHECK(from_body(top, "null").status == KeyStatus::missing);  // an empty body
  CHECK(from_body(top, R"([{"idempotency_key":"k"}])").status == KeyStatus::missing);
  const auto nested = body_spec("/meta/idem~1key");
  CHECK(from_body(nested, R"({"meta":{"idem/key":"k-2"}})").key == "k-2");
  CHECK(from_body(body_spec("/keys/0"), R"({"keys":["k-3"]})").key == "k-3");
  // The same rules as the header's, on the member's value as it is (no sf-string quoting).
  for (const char* bad : {R"({"idempotency_key":""})", R"({"idempotency_key":"two words"})",
                          R"({"idempotency_key":"01234567890123456"})", R"({"idempotency_key":"caf\u00e9"})",
                          R"({"idempotency_key":42})", R"({"idempotency_key":null})",
                          R"({"idempotency_key":["k"]})", R"({"idempotency_key":{"k":"v"}})"}) {
    INFO(bad);
    const auto r = from_body(top, bad);
    CHECK(r.status == KeyStatus::invalid);
    CHECK(r.reason.find("/idempotency_key") != std::string::npos);
  }
  CHECK(from_body(top, R"({"idempotency_key":"\"q\""})").key == "\"q\"");
}

TEST_CASE("read_key: a key in the body and in the header, or in the header instead, is refused") {
  const auto spec = body_spec("/idempotency_key");
  const auto both = from_body(spec, R"({"idempotency_key":"k-1"})", {"k-1"});
  CHECK(both.status == KeyStatus::ambiguous);
  CHECK(both.reason.find("k-1") == std::string::npos);  // reasons never echo a key
  CHECK(from_body(spec, R"({"idempotency_key":"k-1"})", {""}).status == KeyStatus::ambiguous);
  const auto header_only = from_body(spec, R"({"amount":1})", {"k-1"});
  CHECK(header_only.status == KeyStatus::misplaced);
  CHECK(header_only.reason.find("Idempotency-Key") != std::string::npos);
  CHECK(header_only.reason.find("/idempotency_key") != std::string::npos);
  CHECK(from_body(spec, R"({"idempotency_key":7})", {"k"}).status == KeyStatus::ambiguous);
}

TEST_CASE("read_key: a key in the query is one parameter, form-decoded") {
  const auto spec = query_spec("ClientToken");
  CHECK(from_query(spec, "ClientToken=t-1").key == "t-1");
  CHECK(from_query(spec, "a=1&ClientToken=t-1&b=2").key == "t-1");
  CHECK(from_query(spec, "Client%54oken=%74-1").key == "t-1");
  CHECK(from_query(spec, "ClientToken=a%2Bb").key == "a+b");
  CHECK(from_query(spec, "").status == KeyStatus::missing);
  CHECK(from_query(spec, "clienttoken=t").status == KeyStatus::missing);  // names are exact
  for (const char* bad : {"ClientToken=t-1&ClientToken=t-1", "ClientToken=", "ClientToken",
                          "ClientToken=a+b", "ClientToken=a%20b", "ClientToken=a%zz",
                          "ClientToken=a%4", "ClientToken=%C3%A9", "ClientToken=0123456789abcdefg"}) {
    INFO(bad);
    CHECK(from_query(spec, bad).status == KeyStatus::invalid);
  }
  CHECK(from_query(spec, "ClientToken=t-1", {"t-1"}).status == KeyStatus::ambiguous);
  CHECK(from_query(spec, "a=1", {"t-1"}).status == KeyStatus::misplaced);
}

TEST_CASE("read_key: a header route reads the header alone, as parse_key") {
  KeySettings s;
  s.max_length = 16;
  const auto spec = KeySpec::compile(s);
  CHECK(from_query(spec, "ClientToken=x", {"\"k-1\""}).key == "k-1");
  CHECK(from_query(spec, "", {}).status == KeyStatus::missing);
  CHECK(from_query(spec, "", {"a", "b"}).status == KeyStatus::invalid);
}

TEST_CASE("KeySpec::compile refuses a key.pointer that names no one member") {
  for (const char* bad : {"", "/*", "/items/*/key", "/a~2", "idempotency_key"}) {
    INFO(bad);
    CHECK_THROWS_AS(body_spec(bad), std::invalid_argument);
  }
  CHECK(body_spec("/").member.size() == 1);
}
