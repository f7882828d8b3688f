#pragma once
// The stored form of replay headers (the response_headers jsonb column): a JSON array of
// [name, value] pairs, in arrival order, repeats kept:
//   [["Content-Type", "application/json"], ["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"]]
// JSON strings must be Unicode and jsonb refuses \u0000, while HTTP field values may carry
// obs-text bytes. A pair that is not valid UTF-8 without NUL is therefore stored as a
// triple of hex strings tagged "hex" — ["436f6f6b6965", "ff00", "hex"] — so every byte
// string round-trips and ordinary headers stay readable to operators.
//
// The codec is hand-written for this one fixed shape so the store does not depend on a
// JSON library; the decoder accepts any JSON whitespace and escapes PostgreSQL may emit.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/store.hpp"

namespace idem::store::detail {

std::string encode_headers_json(const std::vector<StoredHeader>& headers);

// nullopt when the text is not of the shape above.
std::optional<std::vector<StoredHeader>> decode_headers_json(std::string_view json);

// Valid UTF-8 (as PostgreSQL checks it: no overlongs, surrogates or code points above
// U+10FFFF) and no NUL byte.
bool is_storable_text(std::string_view s) noexcept;

}  // namespace idem::store::detail
