// The stored form of replay headers: order, repeats and every byte survive.
#include <doctest/doctest.h>

#include "store/header_codec.hpp"

using namespace idem::store;
using namespace idem::store::detail;

TEST_CASE("headers encode as an array of [name, value] pairs") {
  CHECK(encode_headers_json({}) == "[]");
  CHECK(encode_headers_json({{"A", "1"}, {"B", "x\"y\\z"}, {"A", "2"}}) ==
        R"([["A","1"],["B","x\"y\\z"],["A","2"]])");
  CHECK(encode_headers_json({{"C", std::string("\x01\t\n", 3)}}) == R"([["C","\u0001\t\n"]])");
  // Not UTF-8 (or containing NUL): hex-tagged triple.
  CHECK(encode_headers_json({{"X", "\xe9"}}) == R"([["58","e9","hex"]])");
  CHECK(encode_headers_json({{"X", std::string("a\0b", 3)}}) == R"([["58","610062","hex"]])");
}

TEST_CASE("decoding accepts what PostgreSQL prints and round-trips every byte string") {
  std::vector<StoredHeader> in = {{"Content-Type", "application/json"},
                                  {"Set-Cookie", "a=1"},
                                  {"Set-Cookie", "b=2"},
                                  {"X-Utf8", "caf\xc3\xa9 \xf0\x9f\x98\x80"},
                                  {"X-Latin1", "caf\xe9"},
                                  {"X-Ctl", "\x1f\x7f"},
                                  {"", ""}};
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  in.push_back({"X-All", all});
  auto out = decode_headers_json(encode_headers_json(in));
  REQUIRE(out.has_value());
  REQUIRE(out->size() == in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    CHECK((*out)[i].name == in[i].name);
    CHECK((*out)[i].value == in[i].value);
  }

  // jsonb's output spacing and escapes, including \u escapes and surrogate pairs.
  auto pg = decode_headers_json(R"( [ ["A", "x\/y"] , ["B", "\u00e9\ud83d\ude00\b\f\r"] ] )");
  REQUIRE(pg.has_value());
  REQUIRE(pg->size() == 2);
  CHECK((*pg)[0].value == "x/y");
  CHECK((*pg)[1].value == "\xc3\xa9\xf0\x9f\x98\x80\b\f\r");
}

TEST_CASE("malformed stored headers are refused") {
  for (const char* bad : {"", "{}", "[", "[[\"a\"]]", "[[\"a\",1]]", "[[\"a\",\"b\",\"c\"]]",
                          "[[\"zz\",\"00\",\"hex\"]]", "[[\"a\",\"b\"]] x", "[[\"a\",\"b\"],]",
                          "[[\"a\",\"\\ud800\"]]", "[[\"a\",\"\\q\"]]", "[[\"a\",\"b\"]"}) {
    CAPTURE(bad);
    CHECK_FALSE(decode_headers_json(bad).has_value());
  }
}

TEST_CASE("storable text follows PostgreSQL's UTF-8 rules") {
  CHECK(is_storable_text(""));
  CHECK(is_storable_text("plain ascii"));
  CHECK(is_storable_text("\xc3\xa9\xe2\x9c\x93\xf0\x9f\x98\x80"));
  CHECK(is_storable_text("\xf4\x8f\xbf\xbf"));             // U+10FFFF
  CHECK_FALSE(is_storable_text(std::string("\0", 1)));     // NUL
  CHECK_FALSE(is_storable_text("\xe9"));                   // Latin-1
  CHECK_FALSE(is_storable_text("\xc0\xaf"));               // overlong
  CHECK_FALSE(is_storable_text("\xe0\x80\xaf"));           // overlong
  CHECK_FALSE(is_storable_text("\xed\xa0\x80"));           // surrogate
  CHECK_FALSE(is_storable_text("\xf4\x90\x80\x80"));       // above U+10FFFF
  CHECK_FALSE(is_storable_text("\xe2\x9c"));               // truncated
}
