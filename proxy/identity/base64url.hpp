#pragma once
// Base64url without padding (RFC 7515 §2, RFC 4648 §5), strict: one encoding per value.
#include <optional>
#include <string>
#include <string_view>

namespace idem::identity {

// nullopt for any character outside the alphabet, padding, a length that no encoding has
// (n % 4 == 1), or non-zero unused bits in the last character: a token whose bytes could
// be spelt two ways is refused rather than read either way.
std::optional<std::string> base64url_decode(std::string_view text);

std::string base64url_encode(std::string_view bytes);

}  // namespace idem::identity
