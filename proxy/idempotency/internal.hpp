#pragma once
// Building blocks of the idempotency component that are not part of its public
// interface but are worth testing on their own (number and string canonicalization,
// media-type and query handling). Other components should not include this file.
#include <optional>
#include <string>
#include <string_view>

#include <vector>

#include "common/text.hpp"
#include "idempotency/json.hpp"

namespace idem::idempotency::detail {

// Canonical text of a JSON number lexeme (RFC 8259 grammar), computed exactly from the
// decimal digits -- never through a double -- so two lexemes canonicalize alike exactly
// when they denote the same rational number. nullopt if the lexeme is not a JSON number
// or its exponent -- as written, or of the value in scientific notation -- is beyond
// +-10^9. The chosen form is documented in number.cpp.
std::optional<std::string> canonical_number(std::string_view lexeme);

// Strict order of two strings by their UTF-16 code units, as RFC 8785 sorts object
// members. Valid UTF-8 is compared as its UTF-16 transcoding; invalid bytes (only
// possible for hand-built Json values) sort after every code unit, so the order stays
// total over arbitrary byte strings.
bool utf16_less(std::string_view a, std::string_view b) noexcept;

// Strictly valid UTF-8 (Unicode Table 3-7: no overlongs, no surrogates, at most U+10FFFF).
bool is_valid_utf8(std::string_view s) noexcept;

// Appends `s` as a canonical JSON string literal (quotes included).
void append_json_string(std::string& out, std::string_view s);

// True for application/json and application/<anything>+json, case-insensitive,
// parameters ignored. Surrounding whitespace is tolerated.
bool is_json_media_type(std::string_view content_type) noexcept;

// The type/subtype of a Content-Type value in lower case ("" when it has none), read as
// leniently as is_json_media_type: parameters are not looked at.
std::string media_type_essence(std::string_view content_type);

// The value of a Content-Type's charset parameter in lower case and unquoted; nullopt
// when there is none. Read leniently: malformed parameters are passed over, as JSON and
// form routes have always ignored parameters other than this one.
std::optional<std::string> media_type_charset(std::string_view content_type);

// A Content-Type value in canonical form, for raw bodies whose media type is hashed with
// them: RFC 9110 §8.3.1 grammar strictly (type "/" subtype, then ";" parameters, a value a
// token or a quoted-string), type, subtype and parameter names in lower case, values
// unquoted (charset's in lower case) and written as a token where they are one, parameters
// sorted by name. nullopt when malformed or when a parameter name repeats.
std::optional<std::string> canonical_media_type(std::string_view content_type);

// Canonical form of a raw query string (without '?'); see query.cpp for the rules.
std::string canonical_query(std::string_view raw);

// RFC 6901 JSON Pointer into its unescaped segments ("" is the whole document: no
// segment); nullopt with *why set when it is not one.
std::optional<std::vector<std::string>> parse_pointer(std::string_view text, std::string* why);

// The value a pointer's segments name in `root` (an object member, or an array element by
// its RFC 6901 index: "0" or digits without a leading zero; "-" names none), or nullptr.
// No wildcard: '*' is a member name here.
const Json* find_pointer(const Json& root, const std::vector<std::string>& segments);
// One step of find_pointer.
const Json* child_of(const Json& node, const std::string& segment);

// Canonical query (canonical_query) without the parameters whose decoded name is
// `excluded` (the idempotency key, on key.from: query routes: the key is never part of the
// operation).
std::string canonical_query(std::string_view raw, std::string_view excluded);

// Decoded values of the query parameters named `name` (names and values form-decoded as
// canonical_query reads them, so the two agree on which parameters these are), in order.
// `malformed` is set when one of them has a '%' that starts no valid escape.
struct QueryValues {
  std::vector<std::string> values;
  bool malformed = false;
};
QueryValues query_values(std::string_view raw, std::string_view name);

// Trim HTTP optional whitespace (SP, HTAB) from both ends.
using text::trim_ows;

// Appends `item` as "<length>:<item>\n": a list of items encoded this way never reads as
// another list (the inputs of every hash the product makes: fingerprint, operation id,
// log hash, the fingerprint memo's key).
void put_item(std::string& out, std::string_view item);

}  // namespace idem::idempotency::detail
