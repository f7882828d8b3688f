// Form bodies (form.hpp): every reading rule and every refusal, table-driven, compared by
// the canonical JSON of the tree they read into.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "idempotency/form.hpp"

using namespace idem::idempotency;

namespace {

// The canonical text of the form's tree, or "refused: <reason>".
std::string read(std::string_view body, bool as_list = false, bool ascii = false) {
  FormOptions options;
  options.repeated_as_list = as_list;
  options.ascii_only = ascii;
  std::string why;
  const auto tree = parse_form(body, options, &why);
  if (!tree) {
    CHECK_FALSE(why.empty());
    return "refused: " + why;
  }
  CHECK(why.empty());
  return canonical_text(*tree);
}

bool refused(std::string_view body, bool as_list = false) {
  return read(body, as_list).starts_with("refused: ");
}

}  // namespace

TEST_CASE("form: values, names, decoding") {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"", "{}"},
      {"a=1", R"({"a":"1"})"},
      {"a=1&b=2", R"({"a":"1","b":"2"})"},
      {"&&a=1&&b=2&", R"({"a":"1","b":"2"})"},          // empty parts are nothing
      {"a", R"({"a":null})"},                            // no '=': a value-less parameter
      {"a=", R"({"a":""})"},
      {"a==b", R"({"a":"=b"})"},                         // split at the first '='
      {"name=Jane+Doe", R"({"name":"Jane Doe"})"},
      {"name=Jane%20Doe", R"({"name":"Jane Doe"})"},
      {"plus=%2B&pct=%25", R"({"pct":"%","plus":"+"})"},
      {"%61=%62", R"({"a":"b"})"},                       // names are decoded too
      {"k=%C3%A9&k2=\xC3\xA9", R"({"k":"é","k2":"é"})"},  // UTF-8, escaped or not
      {"nul=%00", R"({"nul":"\u0000"})"},
      {"semi=a;b", R"({"semi":"a;b"})"},                 // ';' is no separator
      {"[a]=1", R"({"[a]":"1"})"},                       // a leading '[' is part of the name
      {"[]=1", R"({"[]":"1"})"},
      {"a]=1", R"({"a]":"1"})"},
  };
  for (const auto& [body, tree] : table) {
    INFO(body);
    CHECK(read(body) == tree);
  }
}

TEST_CASE("form: bracket nesting into objects and arrays, as Stripe and Rack read it") {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"metadata[source]=app&metadata[campaign]=x", R"({"metadata":{"campaign":"x","source":"app"}})"},
      {"a[b][c]=1", R"({"a":{"b":{"c":"1"}}})"},
      {"a%5Bb%5D=1", R"({"a":{"b":"1"}})"},               // brackets decoded first, as Rack does
      {"expand[]=customer&expand[]=invoice", R"({"expand":["customer","invoice"]})"},
      // Stripe: numbered elements are an array.
      {"items[0][sku]=A1&items[0][qty]=2&items[1][sku]=B2",
       R"({"items":[{"qty":"2","sku":"A1"},{"sku":"B2"}]})"},
      {"items[1][sku]=B2&items[0][sku]=A1", R"({"items":[{"sku":"A1"},{"sku":"B2"}]})"},
      {"a[0]=x&a[1]=y", R"({"a":["x","y"]})"},
      // Rack: a[][x] continues the last element until a key repeats.
      {"items[][sku]=A1&items[][qty]=2&items[][sku]=B2",
       R"({"items":[{"qty":"2","sku":"A1"},{"sku":"B2"}]})"},
      {"i[][o][c]=red&i[][o][s]=L&i[][o][c]=blue", R"({"i":[{"o":{"c":"red","s":"L"}},{"o":{"c":"blue"}}]})"},
      {"a[][]=x&a[][]=y", R"({"a":[["x"],["y"]]})"},
      {"a[][t][]=1&a[][t][]=2", R"({"a":[{"t":["1"]},{"t":["2"]}]})"},
      // Not 0..n-1: an object with those keys.
      {"a[1]=x", R"({"a":{"1":"x"}})"},
      {"a[0]=x&a[2]=y", R"({"a":{"0":"x","2":"y"}})"},
      {"a[00]=x", R"({"a":{"00":"x"}})"},
      {"a[0]=x&a[01]=y", R"({"a":{"0":"x","01":"y"}})"},
      {"0=x&1=y", R"({"0":"x","1":"y"})"},                // the form itself is always an object
      {"metadata[2024]=launch", R"({"metadata":{"2024":"launch"}})"},
  };
  for (const auto& [body, tree] : table) {
    INFO(body);
    CHECK(read(body) == tree);
  }
  // The same form spelt otherwise: member order, + or %20, escaped brackets, [] or [n].
  const auto one = read("items[0][sku]=A%201&items[0][qty]=2&metadata[source]=app");
  CHECK(read("metadata%5Bsource%5D=app&items[][sku]=A+1&items[][qty]=2") == one);
  CHECK(read("items[0][qty]=2&metadata[source]=%61pp&items[0][sku]=A%201") == one);
}

TEST_CASE("form: refused where readers disagree or the input is hostile") {
  const std::vector<std::string> table = {
      "a=1&a=2",                 // first wins in Go, last in Rack and PHP: refused
      "a[b]=1&a[b]=2",
      "a=1&a=1",
      "=x",                      // no name
      "=",
      "%3D=x",                   // the name "=" is fine... (see below)
      "a[b=1", "a[=1", "a[b]c=1", "a[b]]=1", "a[[b]]=1", "a[b][=1",
      "a=1&a[b]=2", "a[b]=1&a=2", "a[]=1&a[b]=2", "a[b]=1&a[]=2", "a[]=1&a=2", "a=1&a[]=2",
      "a[0]=1&a[]=2", "a[]=1&a[0]=2",
      "a=%zz", "a=%4", "a=%", "%=a", "a=%G0",
      "%FF=1", "a=%FF", "a=%C3", "a=%ED%A0%80", "a=%C0%AF", "a=\xFF",
  };
  for (const auto& body : table) {
    INFO(body);
    if (body == "%3D=x") {
      CHECK(read(body) == R"({"=":"x"})");
      continue;
    }
    CHECK(refused(body));
  }
  // What a reason says is fixed text: it never carries the client's bytes.
  const auto why = read("secret-name[x=secret-value");
  CHECK(why.starts_with("refused: "));
  CHECK(why.find("secret") == std::string::npos);
  CHECK(read("a=%C3%A9", false, /*ascii=*/true).starts_with("refused: "));
  CHECK(read("a=b", false, /*ascii=*/true) == R"({"a":"b"})");
}

TEST_CASE("form: repeated names as a list, when the route says so") {
  CHECK(read("a=1&a=2", true) == R"({"a":["1","2"]})");
  CHECK(read("a=1&a=2&a=3", true) == R"({"a":["1","2","3"]})");
  CHECK(read("m[x]=1&m[x]=2", true) == R"({"m":{"x":["1","2"]}})");
  CHECK(read("a=1&a", true) == R"({"a":["1",null]})");
  // Shapes still may not conflict.
  CHECK(refused("a=1&a[b]=2", true));
  CHECK(refused("a[b]=1&a=2", true));
  CHECK(refused("a[][x]=1&a=2", true));
}

TEST_CASE("form: bounded parameters and depth") {
  std::string many;
  for (int i = 0; i < 4096; ++i) many += "p" + std::to_string(i) + "=&";
  CHECK_FALSE(refused(many));
  CHECK(refused(many + "one_more=1"));
  CHECK_FALSE(refused(many + "&&&&"));  // empty parts are not parameters

  std::string deep = "a";
  for (int i = 1; i < 32; ++i) deep += "[x]";
  CHECK_FALSE(refused(deep + "=1"));
  CHECK(refused(deep + "[x]=1"));
  std::string appends = "a";
  for (int i = 1; i < 33; ++i) appends += "[]";
  CHECK(refused(appends + "=1"));
}

TEST_CASE("form_field_path: one name with bracketed keys") {
  using P = std::vector<std::string>;
  CHECK(form_field_path("idempotency_key") == P{"idempotency_key"});
  CHECK(form_field_path("metadata[key]") == P{"metadata", "key"});
  CHECK(form_field_path("items[0][sku]") == P{"items", "0", "sku"});
  CHECK(form_field_path("[a]") == P{"[a]"});
  for (const char* bad : {"", "a[]", "a[", "a[b]c", "a[[b]]", "a=b", "a&b", "a%5Bb%5D", "a+b"}) {
    INFO(bad);
    CHECK_FALSE(form_field_path(bad).has_value());
  }
}
