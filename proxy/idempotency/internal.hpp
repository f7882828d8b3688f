#pragma once
// Building blocks of the idempotency component that are not part of its public
// interface but are worth testing on their own (number and string canonicalization,
// media-type and query handling). Other components should not include this file.
#include <optional>
#include <string>
#include <string_view>

#include "common/text.hpp"

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

// Appends `s` as a canonical JSON string literal (quotes included).
void append_json_string(std::string& out, std::string_view s);

// True for application/json and application/<anything>+json, case-insensitive,
// parameters ignored. Surrounding whitespace is tolerated.
bool is_json_media_type(std::string_view content_type) noexcept;

// Canonical form of a raw query string (without '?'); see query.cpp for the rules.
std::string canonical_query(std::string_view raw);

// Trim HTTP optional whitespace (SP, HTAB) from both ends.
using text::trim_ows;

}  // namespace idem::idempotency::detail
