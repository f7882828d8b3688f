// common/text.hpp: the one set of ASCII, hex and percent-encoding helpers every component
// uses. Each case pins a property a caller depends on (locale-free case folding, both
// hex cases read, exact refusals), so a change here shows which callers it would move.
#include <doctest/doctest.h>

#include <string>

#include "common/text.hpp"

using namespace idem::text;

TEST_CASE("text: ASCII case folding never touches bytes outside ASCII") {
  CHECK(ascii_lower('A') == 'a');
  CHECK(ascii_lower('z') == 'z');
  CHECK(ascii_lower('@') == '@');  // the byte before 'A'
  CHECK(ascii_lower('[') == '[');  // the byte after 'Z'
  CHECK(ascii_upper('a') == 'A');
  CHECK(ascii_upper('`') == '`');
  CHECK(ascii_upper('{') == '{');
  CHECK(ascii_lower('\xc9') == '\xc9');  // Latin-1 'É' is not a letter here
  CHECK(lowercase("Content-TYPE") == "content-type");
  CHECK(uppercase("post") == "POST");
  CHECK(lowercase("\xc9T\xc9") == "\xc9t\xc9");
}

TEST_CASE("text: iequals, istarts_with, iends_with") {
  CHECK(iequals("Idempotency-Key", "idempotency-key"));
  CHECK(iequals("", ""));
  CHECK_FALSE(iequals("abc", "abcd"));
  CHECK_FALSE(iequals("a-b", "a_b"));
  CHECK_FALSE(iequals("\xe9", "\xc9"));  // no Latin-1 folding
  CHECK(istarts_with("Bearer abc", "bearer"));
  CHECK_FALSE(istarts_with("Bear", "bearer"));
  CHECK(iends_with("application/Problem+JSON", "+json"));
  CHECK_FALSE(iends_with("json", "+json"));
}

TEST_CASE("text: trimming") {
  CHECK(trim_ows(" \t a b \t ") == "a b");
  CHECK(trim_ows(" \t ") == "");
  CHECK(trim_ows("") == "");
  CHECK(trim_ows("\r\nx\r\n") == "\r\nx\r\n");  // only SP and HTAB are OWS
  CHECK(trim("--x--", "-") == "x");
  CHECK(trim_end("message\n \n", "\n ") == "message");
  CHECK(trim_end(" x ", " ") == " x");
  CHECK(trim_end("\n\n", "\n") == "");
}

TEST_CASE("text: hex digits both ways") {
  for (int v = 0; v < 16; ++v) {
    CHECK(hex_value(hex_digit(static_cast<unsigned>(v))) == v);
    CHECK(hex_value(hex_digit(static_cast<unsigned>(v), HexCase::upper)) == v);
  }
  CHECK(hex_value('g') == -1);
  CHECK(hex_value('G') == -1);
  CHECK(hex_value('/') == -1);  // the byte before '0'
  CHECK(hex_value(':') == -1);  // the byte after '9'
  CHECK(hex_value('\0') == -1);
  CHECK(hex_digit(0x1a) == 'a');  // only the low four bits count

  const std::string bytes("\x00\x7f\x80\xff" "A", 5);
  CHECK(to_hex(bytes) == "007f80ff41");
  CHECK(to_hex(bytes, HexCase::upper) == "007F80FF41");
  const unsigned char digest[] = {0xde, 0xad, 0xbe, 0xef};
  CHECK(to_hex(digest, 4) == "deadbeef");
  CHECK(to_hex("") == "");

  std::string out = "\\u";
  append_hex_digits(out, 0x2028, 4);
  CHECK(out == "\\u2028");
  out.clear();
  append_hex_digits(out, 0x7, 2, HexCase::upper);
  CHECK(out == "07");

  CHECK(from_hex("007f80ff41") == bytes);
  CHECK(from_hex("007F80FF41") == bytes);
  CHECK(from_hex("") == std::string());
  CHECK_FALSE(from_hex("0"));    // odd length
  CHECK_FALSE(from_hex("0g"));   // not a digit
  CHECK_FALSE(from_hex(" 00"));  // no whitespace

  CHECK(is_lower_hex("0123456789abcdef"));
  CHECK_FALSE(is_lower_hex("ABCDEF"));
  CHECK_FALSE(is_lower_hex(""));
}

TEST_CASE("text: percent-encoded bytes") {
  CHECK(percent_byte("%41", 0) == 'A');
  CHECK(percent_byte("a%2fb", 1) == '/');
  CHECK(percent_byte("%00", 0) == 0);
  CHECK(percent_byte("%ff", 0) == 0xff);
  CHECK(percent_byte("%4", 0) == -1);   // truncated
  CHECK(percent_byte("%4g", 0) == -1);  // not hex
  CHECK(percent_byte("x41", 0) == -1);  // no '%'
  CHECK(percent_byte("%41", 1) == -1);
  CHECK(percent_byte("%41", 7) == -1);  // past the end

  std::string out;
  append_percent_encoded(out, 0xe9);
  append_percent_encoded(out, '/');
  CHECK(out == "%E9%2F");

  out.clear();
  append_uri_component(out, "a-b_c.d~e f/\xe9");
  CHECK(out == "a-b_c.d~e%20f%2F%E9");
  CHECK(is_unreserved('~'));
  CHECK_FALSE(is_unreserved('%'));
  CHECK_FALSE(is_unreserved('\x80'));
}
