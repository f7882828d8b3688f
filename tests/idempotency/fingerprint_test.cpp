// Fingerprint invariants the product promises (contract §4 "Fingerprint"), the canonical
// query and media-type rules, and the operation id / log hash.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "idempotency/fingerprint.hpp"
#include "idempotency/internal.hpp"
#include "idempotency/key.hpp"

using namespace idem::idempotency;
using idem::settings::FingerprintSettings;

namespace {

// A request with sensible defaults; tests change one thing at a time.
struct Req {
  std::string method = "POST";
  std::string scope = "POST /orders";
  std::optional<std::string> content_type = std::string("application/json");
  std::string body = "{}";
  std::vector<std::optional<std::string>> headers;
  std::string query;

  RequestParts parts() const {
    RequestParts p;
    p.method = method;
    p.scope = scope;
    if (content_type) p.content_type = std::string_view(*content_type);
    p.body = body;
    p.header_values = headers;
    p.query = query;
    return p;
  }
};

Req body(std::string b) {
  Req r;
  r.body = std::move(b);
  return r;
}

std::string fp(const FingerprintSpec& spec, const Req& r) {
  const auto res = fingerprint(spec, r.parts());
  REQUIRE_MESSAGE(res.status == FingerprintStatus::ok, res.reason);
  return res.value;
}

FingerprintStatus status(const FingerprintSpec& spec, const Req& r) {
  return fingerprint(spec, r.parts()).status;
}

// The items of a canonical form, split on their length prefixes. Also proves the form
// parses back unambiguously.
std::vector<std::string> items(std::string_view form) {
  std::vector<std::string> out;
  while (!form.empty()) {
    const auto colon = form.find(':');
    REQUIRE(colon != std::string_view::npos);
    const auto n = std::stoul(std::string(form.substr(0, colon)));
    REQUIRE(form.size() >= colon + 1 + n + 1);
    out.emplace_back(form.substr(colon + 1, n));
    REQUIRE(form[colon + 1 + n] == '\n');
    form.remove_prefix(colon + 1 + n + 1);
  }
  return out;
}

// The canonical JSON of the selection (item 5 of the form).
std::string selected(const FingerprintSpec& spec, const Req& r) {
  FingerprintResult failure;
  const auto form = canonical_form(spec, r.parts(), &failure);
  REQUIRE_MESSAGE(form.has_value(), failure.reason);
  const auto parts = items(*form);
  REQUIRE(parts.size() >= 6);
  return parts[5];
}

FingerprintSettings order_settings() {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/customer_id", "/currency", "/amount", "/items", "/shipping/address_id"};
  s.ignore = {"/trace_id", "/client_sent_at"};
  s.defaults = {{"/currency", "\"EUR\""}};
  return s;
}

bool is_lower_hex(const std::string& s, std::size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST_CASE("fingerprint: the contract example route") {
  const auto spec = FingerprintSpec::compile(order_settings());
  const std::string base =
      R"({"customer_id":"c1","currency":"EUR","amount":1000,"items":[{"sku":"a","qty":1}],)"
      R"("shipping":{"address_id":"s1","note":"ring twice"},"trace_id":"t1","client_sent_at":"2024-01-01T00:00:00Z"})";
  const std::string f = fp(spec, body(base));
  CHECK(is_lower_hex(f, 64));

  SUBCASE("member order and whitespace do not matter") {
    CHECK(fp(spec, body(R"(  {"amount" : 1000, "currency":"EUR", "customer_id":"c1",
        "shipping": {"note":"ring twice","address_id":"s1"},
        "items":[ {"qty":1,"sku":"a"} ], "client_sent_at":"2024-01-01T00:00:00Z","trace_id":"t1"} )")) == f);
  }
  SUBCASE("1000, 1000.0, 1e3 are the same amount") {
    for (const char* amount : {"1000.0", "1e3", "1.000e3", "10E2", "1000.000"}) {
      CAPTURE(amount);
      std::string b = base;
      b.replace(b.find("1000"), 4, amount);
      CHECK(fp(spec, body(b)) == f);
    }
  }
  SUBCASE("omitting a member with a default equals sending the default") {
    std::string b = base;
    b.erase(b.find(R"("currency":"EUR",)"), std::string(R"("currency":"EUR",)").size());
    CHECK(fp(spec, body(b)) == f);
  }
  SUBCASE("trace ids, timestamps and unlisted members never count") {
    CHECK(fp(spec, body(R"({"customer_id":"c1","currency":"EUR","amount":1000,"items":[{"sku":"a","qty":1}],)"
                        R"("shipping":{"address_id":"s1","note":"leave at door"},"trace_id":"t2","extra":[1,2,3]})")) ==
          f);
  }
  SUBCASE("a changed amount, item, currency or address changes it") {
    for (const auto& change : std::vector<std::pair<std::string, std::string>>{
             {"1000", "1001"},
             {"1000", "\"1000\""},
             {R"("qty":1)", R"("qty":2)"},
             {R"("sku":"a")", R"("sku":"b")"},
             {R"("currency":"EUR")", R"("currency":"USD")"},
             {R"("currency":"EUR")", R"("currency":null)"},  // an explicit null is not "omitted"
             {R"("address_id":"s1")", R"("address_id":"s2")"},
             {R"("customer_id":"c1")", R"("customer_id":"c2")"},
         }) {
      const std::string& from = change.first;
      const std::string& to = change.second;
      CAPTURE(to);
      std::string b = base;
      b.replace(b.find(from), from.size(), to);
      CHECK(fp(spec, body(b)) != f);
    }
  }
  SUBCASE("method, scope and version are covered") {
    Req r = body(base);
    r.method = "PUT";
    CHECK(fp(spec, r) != f);
    r = body(base);
    r.scope = "POST /v2/orders";
    CHECK(fp(spec, r) != f);
    auto s2 = order_settings();
    s2.version = "2";
    CHECK(fp(FingerprintSpec::compile(s2), body(base)) != f);
  }
  SUBCASE("the selection shows what is covered") {
    CHECK(selected(spec, body(base)) ==
          R"({"/amount":1000,"/currency":"EUR","/customer_id":"c1","/items":[{"qty":1,"sku":"a"}],)"
          R"("/shipping/address_id":"s1"})");
    CHECK(selected(spec, body("{}")) ==
          R"({"/amount":null,"/currency":"EUR","/customer_id":null,"/items":null,"/shipping/address_id":null})");
  }
}

TEST_CASE("fingerprint: the order of configured fields does not matter") {
  FingerprintSettings ab;
  ab.fields = std::vector<std::string>{"/a", "/b"};
  FingerprintSettings ba;
  ba.fields = std::vector<std::string>{"/b", "/a"};
  const Req r = body(R"({"a":1,"b":2,"c":3})");
  CHECK(fp(FingerprintSpec::compile(ab), r) == fp(FingerprintSpec::compile(ba), r));
  // But fields are not interchangeable: swapping values changes the fingerprint.
  CHECK(fp(FingerprintSpec::compile(ab), r) != fp(FingerprintSpec::compile(ab), body(R"({"a":2,"b":1})")));
}

TEST_CASE("fingerprint: whole body minus ignore") {
  FingerprintSettings s;
  s.ignore = {"/trace_id", "/meta/sent_at", "/items/*/note"};
  const auto spec = FingerprintSpec::compile(s);
  const std::string f = fp(spec, body(R"({"a":1,"items":[{"sku":"x"}],"meta":{"v":1}})"));

  CHECK(fp(spec, body(R"({"items":[{"sku":"x","note":"n"}],"meta":{"sent_at":"now","v":1},"a":1.0,"trace_id":"t"})")) == f);
  CHECK(fp(spec, body(R"({"a":2,"items":[{"sku":"x"}],"meta":{"v":1}})")) != f);
  CHECK(fp(spec, body(R"({"a":1,"items":[{"sku":"x"}],"meta":{"v":1},"b":null})")) != f);  // every member counts
  CHECK(fp(spec, body(R"({"a":1,"items":[{"sku":"x"}],"meta":{}})")) != f);
  CHECK(selected(spec, body(R"({"trace_id":"t","a":[1,{"trace_id":2}]})")) == R"({"a":[1,{"trace_id":2}]})");
  // No `fields` and fields covering everything are different selections.
  auto s2 = s;
  s2.fields = std::vector<std::string>{""};
  CHECK(fp(FingerprintSpec::compile(s2), body(R"({"a":1,"items":[{"sku":"x"}],"meta":{"v":1}})")) != f);
}

TEST_CASE("fingerprint: defaults in whole-body mode apply where the parent exists") {
  FingerprintSettings s;
  s.defaults = {{"/currency", "\"EUR\""}, {"/shipping/method", "\"standard\""}, {"/items/*/qty", "1"}};
  const auto spec = FingerprintSpec::compile(s);

  CHECK(fp(spec, body(R"({"amount":5})")) == fp(spec, body(R"({"amount":5,"currency":"EUR"})")));
  CHECK(fp(spec, body(R"({"shipping":{}})")) == fp(spec, body(R"({"shipping":{"method":"standard"}})")));
  CHECK(fp(spec, body(R"({"items":[{"sku":"a"},{"sku":"b","qty":1}]})")) ==
        fp(spec, body(R"({"items":[{"sku":"a","qty":1},{"sku":"b"}]})")));
  CHECK(fp(spec, body(R"({"items":[{"sku":"a","qty":2}]})")) != fp(spec, body(R"({"items":[{"sku":"a"}]})")));
  // Parents are not invented: no shipping object differs from an empty one.
  CHECK(selected(spec, body("{}")) == R"({"currency":"EUR"})");
  CHECK(selected(spec, body(R"({"shipping":{}})")) == R"({"currency":"EUR","shipping":{"method":"standard"}})");
  // A non-object body has no members to default.
  CHECK(selected(spec, body("[1]")) == "[1]");
  CHECK(selected(spec, body("")) == "null");
}

TEST_CASE("fingerprint: defaults nest parent first") {
  FingerprintSettings s;
  s.defaults = {{"/shipping/method", "\"standard\""}, {"/shipping", "{}"}};
  const auto spec = FingerprintSpec::compile(s);
  CHECK(selected(spec, body("{}")) == R"({"shipping":{"method":"standard"}})");
  CHECK(fp(spec, body("{}")) == fp(spec, body(R"({"shipping":{"method":"standard"}})")));
}

TEST_CASE("fingerprint: a field default stands in where the parent is missing too") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/shipping/method", "/amount"};
  s.defaults = {{"/shipping/method", "\"standard\""}};
  const auto spec = FingerprintSpec::compile(s);
  const auto f = fp(spec, body(R"({"amount":1})"));
  CHECK(fp(spec, body(R"({"amount":1,"shipping":{}})")) == f);
  CHECK(fp(spec, body(R"({"amount":1,"shipping":{"method":"standard"}})")) == f);
  CHECK(fp(spec, body(R"({"amount":1,"shipping":null})")) == f);  // nothing to select inside null
  CHECK(fp(spec, body(R"({"amount":1,"shipping":{"method":"express"}})")) != f);
}

TEST_CASE("fingerprint: '*' selects every array element") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/items/*/sku", "/items/*/qty"};
  s.defaults = {{"/items/*/qty", "1"}};
  const auto spec = FingerprintSpec::compile(s);

  CHECK(selected(spec, body(R"({"items":[{"sku":"a","qty":2,"note":"x"},{"sku":"b"},{"qty":3},7]})")) ==
        R"({"/items/*/qty":[2,1,3,1],"/items/*/sku":["a","b",null,null]})");
  CHECK(selected(spec, body(R"({"items":[]})")) == R"({"/items/*/qty":[],"/items/*/sku":[]})");
  // '*' on something that is not an array selects nothing: the default, else null.
  CHECK(selected(spec, body(R"({"items":{"0":{"sku":"a"}}})")) == R"({"/items/*/qty":1,"/items/*/sku":null})");
  CHECK(selected(spec, body("{}")) == R"({"/items/*/qty":1,"/items/*/sku":null})");

  const auto f = fp(spec, body(R"({"items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]})"));
  CHECK(fp(spec, body(R"({"items":[{"sku":"a","note":"gift"},{"qty":2.0,"sku":"b"}]})")) == f);
  CHECK(fp(spec, body(R"({"items":[{"sku":"b","qty":2},{"sku":"a","qty":1}]})")) != f);  // order is data
  CHECK(fp(spec, body(R"({"items":[{"sku":"a","qty":1},{"sku":"b","qty":3}]})")) != f);
  CHECK(fp(spec, body(R"({"items":[{"sku":"a","qty":1}]})")) != f);
}

TEST_CASE("fingerprint: several '*' nest") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/orders/*/lines/*/sku"};
  const auto spec = FingerprintSpec::compile(s);
  CHECK(selected(spec, body(R"({"orders":[{"lines":[{"sku":"a"},{"sku":"b"}]},{"lines":[]},{},{"lines":[{}]}]})")) ==
        R"({"/orders/*/lines/*/sku":[["a","b"],[],null,[null]]})");
}

TEST_CASE("fingerprint: ignore inside a selected subtree") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/items", "/amount"};
  s.ignore = {"/items/*/note", "/items/0/tag", "/amount/debug"};
  const auto spec = FingerprintSpec::compile(s);
  CHECK(selected(spec, body(R"({"items":[{"sku":"a","note":"x","tag":1},{"sku":"b","tag":2}],"amount":5})")) ==
        R"({"/amount":5,"/items":[{"sku":"a"},{"sku":"b","tag":2}]})");
  const auto f = fp(spec, body(R"({"items":[{"sku":"a","note":"x"}],"amount":5})"));
  CHECK(fp(spec, body(R"({"items":[{"sku":"a","note":"y","tag":"t"}],"amount":5})")) == f);
  CHECK(fp(spec, body(R"({"items":[{"sku":"a"}],"amount":5})")) == f);
}

TEST_CASE("fingerprint: ignoring array elements keeps positions") {
  FingerprintSettings s;
  s.ignore = {"/list/0", "/all/*"};
  const auto spec = FingerprintSpec::compile(s);
  CHECK(selected(spec, body(R"({"list":["x","y"],"all":[1,2]})")) == R"({"all":[null,null],"list":[null,"y"]})");
  CHECK(fp(spec, body(R"({"list":["x","y"],"all":[1,2]})")) == fp(spec, body(R"({"list":["z","y"],"all":[3,4]})")));
  CHECK(fp(spec, body(R"({"list":["x","y"],"all":[1,2]})")) != fp(spec, body(R"({"list":["x","z"],"all":[1,2]})")));
}

TEST_CASE("fingerprint: JSON Pointer details") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/a~1b", "/m~0n", "/arr/0", "/arr/01", "/arr/-", "/obj/01", "/obj/-", "/",
                                      "/obj/*"};
  const auto spec = FingerprintSpec::compile(s);
  CHECK(selected(spec, body(R"({"a/b":1,"m~n":2,"arr":[10,11],"obj":{"01":3,"-":4},"":5})")) ==
        R"({"/":5,"/arr/-":null,"/arr/0":10,"/arr/01":null,"/a~1b":1,"/m~0n":2,"/obj/*":null,"/obj/-":4,"/obj/01":3})");
  CHECK(selected(spec, body(R"({"arr":[]})")) ==
        R"({"/":null,"/arr/-":null,"/arr/0":null,"/arr/01":null,"/a~1b":null,"/m~0n":null,"/obj/*":null,"/obj/-":null,"/obj/01":null})");

  FingerprintSettings root;
  root.fields = std::vector<std::string>{""};
  CHECK(selected(FingerprintSpec::compile(root), body(R"({"b":1,"a":2})")) == R"({"":{"a":2,"b":1}})");

  FingerprintSettings huge_index;
  huge_index.fields = std::vector<std::string>{"/arr/99999999999999999999999999"};
  CHECK(selected(FingerprintSpec::compile(huge_index), body(R"({"arr":[1]})")) ==
        R"({"/arr/99999999999999999999999999":null})");
}

TEST_CASE("fingerprint: content type and body") {
  const auto spec = FingerprintSpec::compile(FingerprintSettings{});
  const auto empty = fp(spec, body(""));

  SUBCASE("an empty body is null whatever the Content-Type") {
    for (const std::optional<std::string>& ct :
         {std::optional<std::string>(), std::optional<std::string>("text/plain"),
          std::optional<std::string>("application/json"), std::optional<std::string>("")}) {
      Req r = body("");
      r.content_type = ct;
      CHECK(fp(spec, r) == empty);
    }
    CHECK(fp(spec, body("null")) == empty);  // an explicit null body is the same value
    CHECK(fp(spec, body("{}")) != empty);
  }
  SUBCASE("JSON media types") {
    for (const char* ct : {"application/json", "APPLICATION/JSON", "application/json; charset=utf-8",
                           "application/json;charset=UTF-8", " application/json ", "application/json ; q=1",
                           "application/problem+json", "application/vnd.api+json", "Application/Merge-Patch+JSON",
                           "application/json-patch+json"}) {
      CAPTURE(ct);
      Req r = body("{\"a\":1}");
      r.content_type = ct;
      CHECK(status(spec, r) == FingerprintStatus::ok);
    }
    // The media type's parameters are not part of the fingerprint.
    Req a = body("{\"a\":1}");
    Req b = body("{\"a\":1}");
    b.content_type = "application/json; charset=utf-8";
    CHECK(fp(spec, a) == fp(spec, b));
  }
  SUBCASE("everything else is unsupported") {
    for (const char* ct : {"text/plain", "text/json", "application/jsonp", "application/json-patch",
                           "application/x-www-form-urlencoded", "multipart/form-data", "json", "", "application/",
                           "/json", "application/+json", "application/json+xml", "application /json",
                           "application/json, text/plain", "*/*"}) {
      CAPTURE(ct);
      Req r = body("{\"a\":1}");
      r.content_type = ct;
      const auto res = fingerprint(spec, r.parts());
      CHECK(res.status == FingerprintStatus::unsupported_media_type);
      CHECK(res.value.empty());
      CHECK_FALSE(res.reason.empty());
    }
    Req r = body("{\"a\":1}");
    r.content_type.reset();
    CHECK(status(spec, r) == FingerprintStatus::unsupported_media_type);
  }
  SUBCASE("invalid JSON") {
    for (const char* b : {"{", "{\"a\":1,\"a\":2}", "nope", " ", "{\"a\":NaN}", "{} {}", "[1,]"}) {
      CAPTURE(b);
      const auto res = fingerprint(spec, body(b).parts());
      CHECK(res.status == FingerprintStatus::invalid_json);
      CHECK(res.value.empty());
      CHECK_FALSE(res.reason.empty());
      FingerprintResult failure;
      CHECK_FALSE(canonical_form(spec, body(b).parts(), &failure).has_value());
      CHECK(failure.status == FingerprintStatus::invalid_json);
    }
    CHECK_FALSE(canonical_form(spec, body("{").parts(), nullptr).has_value());
  }
}

TEST_CASE("fingerprint: configured headers") {
  FingerprintSettings s;
  s.headers = {"X-Currency", "Accept-Language"};
  const auto spec = FingerprintSpec::compile(s);
  REQUIRE(spec.header_names() == std::vector<std::string>{"X-Currency", "Accept-Language"});

  auto with = [](std::optional<std::string> cur, std::optional<std::string> lang) {
    Req r;
    r.headers = {std::move(cur), std::move(lang)};
    return r;
  };
  const auto f = fp(spec, with("EUR", "de"));
  CHECK(fp(spec, with(" EUR\t", "  de")) == f);  // OWS trimmed
  CHECK(fp(spec, with("USD", "de")) != f);
  CHECK(fp(spec, with("eur", "de")) != f);  // values are case-sensitive
  CHECK(fp(spec, with("EUR", "fr")) != f);
  // Absent, empty and present are three different things.
  const auto absent = fp(spec, with(std::nullopt, "de"));
  const auto blank = fp(spec, with("", "de"));
  CHECK(absent != f);
  CHECK(blank != f);
  CHECK(absent != blank);
  CHECK(fp(spec, with("  ", "de")) == blank);
  // Values cannot leak into each other's slot.
  CHECK(fp(spec, with("de", "EUR")) != f);
  // Fewer values than names: the rest are absent.
  Req shortr;
  shortr.headers = {std::optional<std::string>("EUR")};
  CHECK(fp(spec, shortr) == fp(spec, with("EUR", std::nullopt)));

  // The configured order and spelling of names do not matter; the set of names does.
  FingerprintSettings reordered;
  reordered.headers = {"accept-language", "x-currency"};
  Req rr;
  rr.headers = {std::optional<std::string>("de"), std::optional<std::string>("EUR")};
  CHECK(fp(FingerprintSpec::compile(reordered), rr) == f);
  CHECK(fp(FingerprintSpec::compile(FingerprintSettings{}), Req{}) != fp(spec, with(std::nullopt, std::nullopt)));
}

TEST_CASE("fingerprint: query string") {
  FingerprintSettings off;
  FingerprintSettings on;
  on.query = true;
  const auto spec_off = FingerprintSpec::compile(off);
  const auto spec_on = FingerprintSpec::compile(on);
  CHECK_FALSE(spec_off.include_query());
  CHECK(spec_on.include_query());

  auto q = [](std::string query) {
    Req r;
    r.query = std::move(query);
    return r;
  };
  // Not included: the query never matters.
  CHECK(fp(spec_off, q("a=1")) == fp(spec_off, q("a=2")));
  CHECK(fp(spec_off, q("")) == fp(spec_off, q("x")));
  // Included: canonical spellings agree, different values do not.
  const auto f = fp(spec_on, q("a=1&b=2"));
  CHECK(fp(spec_on, q("b=2&a=1")) == f);
  CHECK(fp(spec_on, q("&a=1&&b=2&")) == f);
  CHECK(fp(spec_on, q("a=%31&%62=2")) == f);
  CHECK(fp(spec_on, q("a=1&b=3")) != f);
  CHECK(fp(spec_on, q("a=1")) != f);
  CHECK(fp(spec_on, q("a=1&b=2&b=2")) != f);
  // "included and empty" differs from "not included".
  CHECK(fp(spec_on, q("")) != fp(spec_off, q("")));
}

TEST_CASE("canonical_query: table") {
  const std::vector<std::pair<const char*, const char*>> table = {
      {"", ""},
      {"&", ""},
      {"&&&", ""},
      {"a=1", "a=1"},
      {"b=2&a=1", "a=1&b=2"},
      {"a=2&a=1", "a=1&a=2"},  // sorted by (name, value)
      {"a=1&a=1", "a=1&a=1"},  // repeats kept
      {"a", "a="},
      {"a=", "a="},
      {"=x", "=x"},
      {"a=b=c", "a=b%3Dc"},  // split at the first '='
      {"q=a+b", "q=a%20b"},
      {"q=a%20b", "q=a%20b"},
      {"q=a%2Bb", "q=a%2Bb"},
      {"q=a%2bb", "q=a%2Bb"},
      {"q=%7e%7E~", "q=~~~"},
      {"q=%41", "q=A"},
      {"k%3D=v%26", "k%3D=v%26"},
      {"q=%zz", "q=%25zz"},  // malformed escapes stay literal
      {"q=%4", "q=%254"},
      {"q=%", "q=%25"},
      {"q=caf%C3%A9", "q=caf%C3%A9"},
      {"q=caf\xc3\xa9", "q=caf%C3%A9"},
      {"q=a/b?c:d@e", "q=a%2Fb%3Fc%3Ad%40e"},
      {"Q=1&q=1", "Q=1&q=1"},  // names are case-sensitive
      {"a=1;b=2", "a=1%3Bb%3D2"},
  };
  for (const auto& row : table) {
    const auto& in = row.first;
    const auto& out = row.second;
    CAPTURE(in);
    CHECK(detail::canonical_query(in) == out);
    CHECK(detail::canonical_query(detail::canonical_query(in)) == out);  // idempotent
  }
}

TEST_CASE("is_json_media_type") {
  CHECK(detail::is_json_media_type("application/json"));
  CHECK(detail::is_json_media_type("application/ld+json;profile=x"));
  CHECK_FALSE(detail::is_json_media_type("application/+json"));
  CHECK_FALSE(detail::is_json_media_type("applicationjson"));
  CHECK_FALSE(detail::is_json_media_type("application/js\x01on"));
}

TEST_CASE("canonical_form: pinned layout (changing it changes every stored fingerprint)") {
  FingerprintSettings s;
  s.version = "7";
  s.fields = std::vector<std::string>{"/b", "/a"};
  s.headers = {"X-B", "X-A"};
  s.query = true;
  const auto spec = FingerprintSpec::compile(s);
  Req r = body(R"({"a":1.0,"b":"x","c":true})");
  r.headers = {std::optional<std::string>(" vb "), std::nullopt};
  r.query = "z=1&y=2";
  FingerprintResult failure;
  const auto form = canonical_form(spec, r.parts(), &failure);
  REQUIRE(form.has_value());
  const std::string want =
      "23:idemproxy-fingerprint/1\n"
      "1:7\n"
      "4:POST\n"
      "12:POST /orders\n"
      "6:fields\n"
      "17:{\"/a\":1,\"/b\":\"x\"}\n"
      "29:1:2\n3:x-a\n1:-\n3:x-b\n1:+\n2:vb\n\n"
      "1:+\n"
      "7:y=2&z=1\n";
  CHECK(*form == want);
  CHECK(fp(spec, r) == sha256_hex(want));

  // The same request without query / with whole-body selection.
  auto s2 = s;
  s2.query = false;
  s2.fields.reset();
  s2.headers.clear();
  const auto form2 = canonical_form(FingerprintSpec::compile(s2), r.parts(), &failure);
  REQUIRE(form2.has_value());
  CHECK(*form2 ==
        "23:idemproxy-fingerprint/1\n1:7\n4:POST\n12:POST /orders\n4:body\n"
        "24:{\"a\":1,\"b\":\"x\",\"c\":true}\n4:1:0\n\n1:-\n");
}

TEST_CASE("canonical_form: field contents cannot forge other fields") {
  // Without length prefixes these pairs would concatenate to the same bytes.
  const auto spec = FingerprintSpec::compile(FingerprintSettings{});
  Req a;
  a.method = "POST";
  a.scope = "X /o";
  Req b;
  b.method = "POST X";
  b.scope = "/o";
  CHECK(fp(spec, a) != fp(spec, b));

  FingerprintSettings hs;
  hs.headers = {"A", "B"};
  const auto hspec = FingerprintSpec::compile(hs);
  Req h1;
  h1.headers = {std::optional<std::string>("1:+\n"), std::nullopt};
  Req h2;
  h2.headers = {std::optional<std::string>(""), std::optional<std::string>("")};
  CHECK(fp(hspec, h1) != fp(hspec, h2));
}

TEST_CASE("FingerprintSpec::compile refuses bad configuration with a clear message") {
  struct Bad {
    const char* name;
    FingerprintSettings s;
    const char* mention;  // the message must name this
  };
  std::vector<Bad> bad;
  auto add = [&](const char* name, auto mutate, const char* mention) {
    FingerprintSettings s;
    mutate(s);
    bad.push_back({name, s, mention});
  };
  using V = std::vector<std::string>;
  add("field without slash", [](auto& s) { s.fields = V{"amount"}; }, "amount");
  add("bad ~ escape", [](auto& s) { s.fields = V{"/a~2b"}; }, "/a~2b");
  add("trailing ~", [](auto& s) { s.fields = V{"/a~"}; }, "/a~");
  add("duplicate field", [](auto& s) { s.fields = V{"/a", "/a"}; }, "/a");
  add("bad ignore", [](auto& s) { s.ignore = {"x"}; }, "x");
  add("ignore the root", [](auto& s) { s.ignore = {""}; }, "ignore");
  add("ignore a field", [](auto& s) {
    s.fields = V{"/a"};
    s.ignore = {"/a"};
  }, "/a");
  add("ignore one of several fields", [](auto& s) {
    s.fields = V{"/a/b", "/ab"};
    s.ignore = {"/a/b"};
  }, "/a/b");
  add("ignore a field's parent", [](auto& s) {
    s.fields = V{"/items/*/sku"};
    s.ignore = {"/items"};
  }, "/items/*/sku");
  add("bad default pointer", [](auto& s) { s.defaults = {{"currency", "\"EUR\""}}; }, "currency");
  add("default for the root", [](auto& s) { s.defaults = {{"", "1"}}; }, "defaults");
  add("default ending in *", [](auto& s) { s.defaults = {{"/items/*", "1"}}; }, "/items/*");
  add("default not JSON", [](auto& s) { s.defaults = {{"/currency", "EUR"}}; }, "/currency");
  add("default with trailing data", [](auto& s) { s.defaults = {{"/currency", "\"EUR\" x"}}; }, "/currency");
  add("default outside the fields", [](auto& s) {
    s.fields = V{"/amount"};
    s.defaults = {{"/curency", "\"EUR\""}};
  }, "/curency");
  add("empty header name", [](auto& s) { s.headers = {""}; }, "headers");
  add("header name with space", [](auto& s) { s.headers = {"X Y"}; }, "X Y");
  add("header listed twice", [](auto& s) { s.headers = {"X-A", "x-a"}; }, "x-a");

  for (const auto& b : bad) {
    CAPTURE(b.name);
    try {
      (void)FingerprintSpec::compile(b.s);
      FAIL("compile accepted a bad configuration");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(b.mention) != std::string::npos);
    }
  }
}

TEST_CASE("FingerprintSpec::compile accepts sensible configurations") {
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/items", "/items/*/sku", "/shipping/address_id", ""};
  s.defaults = {{"/items/*/qty", "1"}, {"/shipping/address_id", "null"}, {"/x", "{\"a\":[1,2]}"}};
  s.ignore = {"/items/*/note", "/trace_id"};
  s.headers = {"X-A", "x-b"};
  CHECK_NOTHROW((void)FingerprintSpec::compile(s));
  CHECK_NOTHROW((void)FingerprintSpec::compile(FingerprintSettings{}));
  CHECK_NOTHROW((void)FingerprintSpec::compile(order_settings()));
  FingerprintSettings empty_fields;
  empty_fields.fields = std::vector<std::string>{};  // nothing from the body counts
  const auto spec = FingerprintSpec::compile(empty_fields);
  CHECK(fp(spec, body(R"({"a":1})")) == fp(spec, body(R"({"a":2})")));
  CHECK(selected(spec, body(R"({"a":1})")) == "{}");
}

TEST_CASE("operation_id, log_hash, sha256_hex") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  const auto id = operation_id("t1", "POST /orders", "k1");
  CHECK(is_lower_hex(id, 64));
  CHECK(operation_id("t1", "POST /orders", "k1") == id);  // stable
  std::set<std::string> ids = {
      id,
      operation_id("t2", "POST /orders", "k1"),
      operation_id("t1", "POST /refunds", "k1"),
      operation_id("t1", "POST /orders", "k2"),
      // concatenations that would collide without length prefixes
      operation_id("t1P", "OST /orders", "k1"),
      operation_id("t1", "POST /orders", ""),
      operation_id("t1", "POST /ordersk1", ""),
      operation_id("", "t1POST /orders", "k1"),
  };
  CHECK(ids.size() == 8);

  const auto lh = log_hash("t1", "k1");
  CHECK(is_lower_hex(lh, 12));
  CHECK(log_hash("t1", "k1") == lh);
  CHECK(log_hash("t2", "k1") != lh);
  CHECK(log_hash("t1", "k2") != lh);
  CHECK(lh.find("k1") == std::string::npos);
  // Domain separation: the log hash is not a piece of the id sent upstream.
  CHECK(id.find(lh) == std::string::npos);
  CHECK(sha256_hex("t1k1").substr(0, 12) != lh);
}

namespace {

idem::settings::KeySettings body_key(std::string pointer) {
  idem::settings::KeySettings k;
  k.from = idem::settings::KeySource::body;
  k.pointer = std::move(pointer);
  return k;
}

idem::settings::KeySettings query_key(std::string param) {
  idem::settings::KeySettings k;
  k.from = idem::settings::KeySource::query;
  k.param = std::move(param);
  return k;
}

}  // namespace

TEST_CASE("fingerprint: the member carrying the key is never part of the operation") {
  // Whole body: the key member goes, everything else counts.
  const auto whole = FingerprintSpec::compile(FingerprintSettings{}, body_key("/idempotency_key"));
  const auto a = fp(whole, body(R"({"idempotency_key":"k-1","amount":10})"));
  CHECK(fp(whole, body(R"({"amount":10,"idempotency_key":"k-2"})")) == a);
  CHECK(fp(whole, body(R"({"amount":10})")) == a);
  CHECK(fp(whole, body(R"({"idempotency_key":"k-1","amount":11})")) != a);
  CHECK(selected(whole, body(R"({"idempotency_key":"k-1","amount":10})")) == R"({"amount":10})");
  // Nested, and beside fields that do not include it.
  auto fields = order_settings();
  const auto nested = FingerprintSpec::compile(fields, body_key("/meta/key"));
  CHECK(selected(nested, body(R"({"customer_id":"c","meta":{"key":"x"}})")) ==
        selected(nested, body(R"({"customer_id":"c","meta":{"key":"y"}})")));
  // Without a body key, the same member is data like any other.
  const auto plain = FingerprintSpec::compile(FingerprintSettings{});
  CHECK(fp(plain, body(R"({"idempotency_key":"k-1","amount":10})")) !=
        fp(plain, body(R"({"idempotency_key":"k-2","amount":10})")));
  // The layout is the one pinned above: a route without a body key keeps its fingerprints.
  CHECK(fp(whole, body(R"({"amount":10})")) == fp(plain, body(R"({"amount":10})")));
}

TEST_CASE("fingerprint: the query parameter carrying the key is never part of the operation") {
  FingerprintSettings on;
  on.query = true;
  const auto spec = FingerprintSpec::compile(on, query_key("ClientToken"));
  auto q = [](std::string query) {
    Req r;
    r.query = std::move(query);
    return r;
  };
  const auto f = fp(spec, q("ClientToken=t-1&dry=1"));
  CHECK(fp(spec, q("dry=1&ClientToken=t-2")) == f);
  CHECK(fp(spec, q("dry=1&Client%54oken=t-3")) == f);  // the name as it reads decoded
  CHECK(fp(spec, q("dry=1")) == f);
  CHECK(fp(spec, q("ClientToken=t-1&dry=2")) != f);
  CHECK(fp(spec, q("clienttoken=t-1&dry=1")) != f);  // another parameter: names are exact
  CHECK(detail::canonical_query("ClientToken=t&b=2&a=1", "ClientToken") == "a=1&b=2");
}

TEST_CASE("FingerprintSpec::compile refuses a field that holds the body key") {
  auto s = order_settings();
  s.fields->push_back("/idempotency_key");
  CHECK_THROWS_WITH_AS(FingerprintSpec::compile(s, body_key("/idempotency_key")),
                       doctest::Contains("holds the idempotency key"), std::invalid_argument);
  FingerprintSettings below;
  below.fields = std::vector<std::string>{"/meta/key/part"};
  CHECK_THROWS_AS(FingerprintSpec::compile(below, body_key("/meta/key")), std::invalid_argument);
  // A field around the key member selects the rest of it.
  FingerprintSettings parent;
  parent.fields = std::vector<std::string>{"/meta"};
  const auto around = FingerprintSpec::compile(parent, body_key("/meta/key"));
  CHECK(selected(around, body(R"({"meta":{"key":"k","src":"app"}})")) == R"({"/meta":{"src":"app"}})");
  FingerprintSettings sibling;
  sibling.fields = std::vector<std::string>{"/meta/other"};
  CHECK_NOTHROW(FingerprintSpec::compile(sibling, body_key("/meta/key")));
}

namespace {

using idem::settings::BodyFormat;

FingerprintSettings format(BodyFormat f) {
  FingerprintSettings s;
  s.format = f;
  return s;
}

Req typed(std::string content_type, std::string b) {
  Req r;
  r.content_type = std::move(content_type);
  r.body = std::move(b);
  return r;
}

Req form(std::string b) { return typed("application/x-www-form-urlencoded", std::move(b)); }

BodyParse parsed(const FingerprintSpec& spec, const Req& r) {
  const auto p = r.parts();
  return parse_body(spec.body(), p.content_type, p.body);
}

}  // namespace

TEST_CASE("parse_body: each format's media type and charset") {
  const auto json = FingerprintSpec::compile(format(BodyFormat::json));
  const auto frm = FingerprintSpec::compile(format(BodyFormat::form));
  auto raw_settings = format(BodyFormat::raw);
  raw_settings.media_types = {"application/x-protobuf", "application/xml"};
  const auto raw = FingerprintSpec::compile(raw_settings);
  const auto any_raw = FingerprintSpec::compile(format(BodyFormat::raw));

  struct Case {
    const FingerprintSpec* spec;
    std::optional<std::string> content_type;
    std::string body;
    BodyStatus status;
  };
  const std::vector<Case> table = {
      {&json, "application/json", "{}", BodyStatus::ok},
      {&json, "application/json; charset=UTF-8", "{}", BodyStatus::ok},
      {&json, "application/json;charset=\"utf-8\"", "{}", BodyStatus::ok},
      {&json, "application/json; charset=us-ascii", R"({"a":"b"})", BodyStatus::ok},
      {&json, "application/json; charset=us-ascii", "{\"a\":\"\xC3\xA9\"}", BodyStatus::invalid_json},
      {&json, "application/json; charset=iso-8859-1", "{}", BodyStatus::unsupported_charset},
      {&json, "application/json; charset=utf-16", "{}", BodyStatus::unsupported_charset},
      {&json, "application/json; foo", "{}", BodyStatus::ok},  // other parameters: ignored, as always
      {&json, "application/x-www-form-urlencoded", "a=1", BodyStatus::unsupported_media_type},
      {&json, std::nullopt, "", BodyStatus::ok},
      {&frm, "application/x-www-form-urlencoded", "a=1", BodyStatus::ok},
      {&frm, "Application/X-WWW-Form-Urlencoded ; charset=utf-8", "a=1", BodyStatus::ok},
      {&frm, "application/x-www-form-urlencoded; charset=windows-1252", "a=1", BodyStatus::unsupported_charset},
      {&frm, "application/x-www-form-urlencoded; charset=us-ascii", "a=%C3%A9", BodyStatus::invalid_form},
      {&frm, "application/json", "{}", BodyStatus::unsupported_media_type},
      {&frm, "multipart/form-data; boundary=x", "--x--", BodyStatus::unsupported_media_type},
      {&frm, std::nullopt, "a=1", BodyStatus::unsupported_media_type},
      {&frm, "application/x-www-form-urlencoded", "a=1&a=2", BodyStatus::invalid_form},
      {&frm, "text/plain", "", BodyStatus::ok},  // empty: nothing to misread
      {&raw, "application/x-protobuf", "\x08\x96\x01", BodyStatus::ok},
      {&raw, "Application/XML; charset=UTF-8", "<a/>", BodyStatus::ok},
      {&raw, "application/json", "{}", BodyStatus::unsupported_media_type},
      {&raw, "application/x-protobuf; a=1; a=2", "x", BodyStatus::unsupported_media_type},
      {&raw, "application/x-protobuf; a", "x", BodyStatus::unsupported_media_type},
      {&raw, "application/x-protobuf; a=\"unclosed", "x", BodyStatus::unsupported_media_type},
      {&raw, "application/", "x", BodyStatus::unsupported_media_type},
      {&raw, std::nullopt, "x", BodyStatus::unsupported_media_type},
      {&raw, std::nullopt, "", BodyStatus::ok},
      {&any_raw, "application/vnd.acme.order+cbor", "\xA1\x01\x02", BodyStatus::ok},
  };
  for (const auto& c : table) {
    INFO(c.content_type.value_or("(none)"), " / ", c.body);
    Req r = typed("", c.body);
    r.content_type = c.content_type;
    const auto p = parsed(*c.spec, r);
    CHECK(p.status == c.status);
    CHECK(p.reason.empty() == (c.status == BodyStatus::ok));
  }
  CHECK(problem_code(BodyStatus::unsupported_charset) == "unsupported_charset");
  CHECK(problem_code(BodyStatus::invalid_form) == "invalid_form");
  CHECK(http_status(BodyStatus::unsupported_charset) == 415);
  CHECK(http_status(BodyStatus::invalid_form) == 400);
}

TEST_CASE("fingerprint: a form is the same request however it is encoded or ordered") {
  auto s = format(BodyFormat::form);
  const auto whole = FingerprintSpec::compile(s);
  const auto f = fp(whole, form("items[0][sku]=A%201&items[0][qty]=2&metadata[source]=app&name=Jane+Doe"));
  CHECK(fp(whole, form("name=Jane%20Doe&metadata%5Bsource%5D=app&items[][qty]=2&items[][sku]=A+1")) == f);
  CHECK(fp(whole, typed("application/x-www-form-urlencoded; charset=UTF-8",
                        "metadata[source]=app&name=Jane+Doe&items[0][qty]=2&items[0][sku]=A 1")) == f);
  CHECK(fp(whole, form("items[0][sku]=A%201&items[0][qty]=3&metadata[source]=app&name=Jane+Doe")) != f);
  CHECK(fp(whole, form("items[0][sku]=A%201&items[0][qty]=2&metadata[source]=app&name=Jane")) != f);
  CHECK(fp(whole, form("items[0][sku]=A%201&items[0][qty]=2&metadata[source]=app")) != f);
  // The same tree from JSON is another domain: a form route's records stay its own.
  const auto json = FingerprintSpec::compile(FingerprintSettings{});
  CHECK(fp(json, body(R"({"a":"1"})")) != fp(whole, form("a=1")));
  CHECK(selected(whole, form("b=2&a=1")) == R"({"a":"1","b":"2"})");
}

TEST_CASE("fingerprint: fields pointers and defaults work on a form unchanged") {
  auto s = format(BodyFormat::form);
  s.fields = std::vector<std::string>{"/customer", "/currency", "/items/*/price"};
  s.defaults = {{"/currency", "\"eur\""}};
  s.ignore = {"/trace"};
  const auto spec = FingerprintSpec::compile(s);
  const auto f = fp(spec, form("customer=cus_1&items[0][price]=p_1&items[1][price]=p_2&trace=t1"));
  CHECK(fp(spec, form("customer=cus_1&currency=eur&items[][price]=p_1&items[][price]=p_2")) == f);
  CHECK(fp(spec, form("customer=cus_1&items[0][price]=p_1&items[1][price]=p_2&items[1][qty]=9")) == f);
  CHECK(fp(spec, form("customer=cus_1&currency=usd&items[0][price]=p_1&items[1][price]=p_2")) != f);
  CHECK(fp(spec, form("customer=cus_1&items[0][price]=p_1")) != f);
  CHECK(selected(spec, form("customer=cus_1&items[0][price]=p_1")) ==
        R"({"/currency":"eur","/customer":"cus_1","/items/*/price":["p_1"]})");
}

TEST_CASE("fingerprint: a form's key member, by form field path or JSON Pointer, is left out") {
  auto s = format(BodyFormat::form);
  idem::settings::KeySettings k;
  k.from = idem::settings::KeySource::body;
  for (const char* where : {"meta[key]", "/meta/key"}) {
    INFO(where);
    k.pointer = where;
    const auto spec = FingerprintSpec::compile(s, k);
    CHECK(fp(spec, form("amount=1&meta[key]=k-1&meta[src]=app")) ==
          fp(spec, form("amount=1&meta[key]=k-2&meta[src]=app")));
    CHECK(selected(spec, form("amount=1&meta[key]=k-1&meta[src]=app")) ==
          R"({"amount":"1","meta":{"src":"app"}})");
  }
}

TEST_CASE("fingerprint: raw is the exact bytes with their media type") {
  const auto spec = FingerprintSpec::compile(format(BodyFormat::raw));
  const std::string proto("\x0a\x03" "A-1\x10\x02\x00\xff", 9);
  const auto f = fp(spec, typed("application/x-protobuf", proto));
  CHECK(fp(spec, typed("Application/X-Protobuf", proto)) == f);
  std::string changed = proto;
  changed[4] = '2';
  CHECK(fp(spec, typed("application/x-protobuf", changed)) != f);
  CHECK(fp(spec, typed("application/x-protobuf", proto + std::string(1, '\0'))) != f);
  CHECK(fp(spec, typed("application/octet-stream", proto)) != f);
  // Parameters count, in one spelling.
  const auto g = fp(spec, typed("application/x-protobuf; proto=orders.Create; charset=UTF-8", proto));
  CHECK(fp(spec, typed("application/x-protobuf;CHARSET=\"utf-8\";  proto=\"orders.Create\"", proto)) == g);
  CHECK(fp(spec, typed("application/x-protobuf; proto=orders.Refund; charset=utf-8", proto)) != g);
  CHECK(g != f);
  // An empty body with or without a type.
  Req none = typed("", "");
  none.content_type.reset();
  CHECK(fp(spec, none) != fp(spec, typed("application/x-protobuf", "")));
}

TEST_CASE("canonical_form: pinned layout of form and raw bodies") {
  const auto frm = FingerprintSpec::compile(format(BodyFormat::form));
  FingerprintResult failure;
  auto r = form("b=2&a[]=1");
  const auto f = canonical_form(frm, r.parts(), &failure);
  REQUIRE(f);
  CHECK(*f ==
        "23:idemproxy-fingerprint/1\n1:1\n4:POST\n12:POST /orders\n9:form:body\n19:{\"a\":[\"1\"],\"b\":\"2\"}\n"
        "4:1:0\n\n1:-\n");
  const auto raw = FingerprintSpec::compile(format(BodyFormat::raw));
  const auto g = canonical_form(raw, typed("text/xml; Charset=UTF-8", "<a/>").parts(), &failure);
  REQUIRE(g);
  CHECK(*g == "23:idemproxy-fingerprint/1\n1:1\n4:POST\n12:POST /orders\n3:raw\n22:text/xml;charset=utf-8\n64:" +
                  sha256_hex("<a/>") + "\n4:1:0\n\n1:-\n");
}

TEST_CASE("FingerprintSpec::compile: what each format cannot have") {
  auto raw = format(BodyFormat::raw);
  raw.fields = std::vector<std::string>{"/a"};
  CHECK_THROWS_AS(FingerprintSpec::compile(raw), std::invalid_argument);
  raw = format(BodyFormat::raw);
  idem::settings::KeySettings k;
  k.from = idem::settings::KeySource::body;
  k.pointer = "/key";
  CHECK_THROWS_AS(FingerprintSpec::compile(raw, k), std::invalid_argument);
  auto frm = format(BodyFormat::form);
  frm.defaults = {{"/qty", "1"}};
  CHECK_THROWS_WITH_AS(FingerprintSpec::compile(frm), doctest::Contains("strings only"), std::invalid_argument);
  frm.defaults = {{"/qty", "\"1\""}, {"/tags", "[\"a\",null]"}};
  CHECK_NOTHROW(FingerprintSpec::compile(frm));
  auto json = format(BodyFormat::json);
  json.media_types = {"application/json"};
  CHECK_THROWS_AS(FingerprintSpec::compile(json), std::invalid_argument);
  // A JSON body's key member is a JSON Pointer; a form's may be a field path.
  k.pointer = "meta[key]";
  CHECK_THROWS_AS(KeySpec::compile(k, BodyFormat::json), std::invalid_argument);
  CHECK(KeySpec::compile(k, BodyFormat::form).member == std::vector<std::string>{"meta", "key"});
  CHECK_THROWS_AS(KeySpec::compile(k, BodyFormat::raw), std::invalid_argument);
}

TEST_CASE("fingerprint: consuming the parsed body gives the same fingerprint as reading it") {
  // The gateway's fingerprint takes the parsed tree (and moves selected parts out of it when
  // no field overlaps another); explain and the parsing overload read it. Every shape of
  // selection must agree, overlapping fields above all (a field taken by the first would
  // be missing for the second).
  const std::vector<std::vector<std::string>> field_lists = {
      {"/customer_id", "/currency", "/amount", "/items", "/shipping/address_id"},  // disjoint
      {"/items", "/items/*/sku", "/currency"},                                     // overlap
      {"/items/*/sku", "/items/0", "/currency"},                                   // via '*'
      {"/items/*/sku", "/items/*/qty", "/currency"},                               // siblings
      {"/shipping", "/shipping/address_id", "/currency"},                          // overlap
      {"/a/b", "/a/c", "/a/b", "/currency"},  // listed twice: refused, skipped below
  };
  const std::vector<std::string> bodies = {
      R"({"customer_id":"c1","amount":1000,"items":[{"sku":"A","qty":2},{"sku":"B"}],"shipping":{"address_id":"s1","x":1}})",
      R"({"items":[{"qty":1}],"trace_id":"t"})",
      R"({"currency":null,"items":"not an array","shipping":[1,2]})",
      R"({})",
      R"([1,2,3])",
  };
  int compared = 0;
  for (const auto& fields : field_lists) {
    FingerprintSettings s;
    s.fields = fields;
    s.ignore = {"/trace_id", "/items/*/note"};
    s.defaults = {{"/currency", "\"EUR\""}};
    std::optional<FingerprintSpec> spec;
    try {
      spec = FingerprintSpec::compile(s);
    } catch (const std::invalid_argument&) {
      continue;
    }
    for (const auto& b : bodies) {
      const Req r = body(b);
      auto parsed = parse_body(spec->body(), r.content_type, r.body);
      REQUIRE(parsed.status == BodyStatus::ok);
      const auto read = fingerprint(*spec, r.parts(), parsed.body);
      CHECK(fingerprint(*spec, r.parts(), std::move(parsed.body)) == read);
      CHECK(read == fp(*spec, r));
      ++compared;
    }
  }
  CHECK(compared == 25);

  // And what overlapping fields select: each field its whole part, whichever comes first.
  FingerprintSettings s;
  s.fields = std::vector<std::string>{"/items", "/items/*/sku"};
  const auto spec = FingerprintSpec::compile(s);
  const Req r = body(bodies[0]);
  CHECK(selected(spec, r) ==
        R"({"/items":[{"qty":2,"sku":"A"},{"sku":"B"}],"/items/*/sku":["A","B"]})");
  auto parsed = parse_body(spec.body(), r.content_type, r.body);
  CHECK(fingerprint(spec, r.parts(), std::move(parsed.body)) == fp(spec, r));
}
