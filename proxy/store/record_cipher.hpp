#pragma once
// Encryption at rest of a record's answer (docs/configuration.md, `encryption`): the
// replay headers and the body of a StoredResponse are sealed with AES-256-GCM (OpenSSL
// EVP), each on its own:
//   - the body column holds the sealed body (an omitted body stays NULL);
//   - the headers column holds one pseudo header, `:sealed` (a name no HTTP field can
//     have), whose value is the base64 of the sealed header list.
//
//   sealed = magic "\0IDEMENC" | version 1 | key id length | key id | nonce (12) |
//            ciphertext | tag (16)
//   header list = u32 count, then per header u32 name length, name, u32 value length, value
//   associated data = "idemproxy-record/1", the part ("headers" or "body") and, each
//            length-prefixed, the tenant, the scope (endpoint), the key and the status
//
// Because the record's identity is associated data, a sealed answer copied to another
// record (another tenant, scope or key), given another status, or with its headers and
// body swapped, does not open. The key id names the key that sealed it, so old keys keep
// opening what they sealed (rotation).
//
// The nonce is an HMAC-SHA256 of the associated data and the plaintext under a nonce key
// derived from the encryption key (a synthetic IV): the same answer of the same record
// seals to the same bytes, which the store's check of a retried completion relies on
// (PgStore compares the stored body), while two different plaintexts get different nonces
// except with probability 2^-96 per pair. It reveals only that two sealed values of one
// record are equal.
//
// Pure (no I/O): unit-tested without a database.
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "store/record.hpp"

namespace idem::store {

using EncryptionKey = std::array<std::uint8_t, 32>;

class KeyRing {
 public:
  // Throws std::invalid_argument for an id that is not 1-64 of [A-Za-z0-9._-], a repeated
  // id, or an active id that is not among the keys.
  KeyRing(std::map<std::string, EncryptionKey> keys, std::string active);

  const std::string& active_id() const noexcept { return active_; }
  const EncryptionKey* find(std::string_view id) const;
  const EncryptionKey& active() const { return *find(active_); }

 private:
  std::map<std::string, EncryptionKey, std::less<>> keys_;
  std::string active_;
};

// The key in a key file: 32 bytes as 64 hex digits or as standard base64 (44 characters),
// surrounding whitespace ignored. Throws std::invalid_argument otherwise (the message never
// quotes the file's content).
EncryptionKey parse_key_file(std::string_view text);

bool is_sealed(std::string_view body) noexcept;

// `response` with headers and body sealed under the ring's active key.
StoredResponse seal(const KeyRing& ring, const RecordId& id, const StoredResponse& response);

// What the key id of a sealed body is (for the admin view and tests); nullopt if not sealed.
std::optional<std::string> sealed_key_id(std::string_view body);

enum class OpenError { unknown_key, invalid };

// A sealed response opened; a response that is not sealed (written before encryption was
// enabled, or by a backend with completion: backend) is returned as is.
std::optional<StoredResponse> open(const KeyRing& ring, const RecordId& id, const StoredResponse& stored,
                                   OpenError* why = nullptr);

}  // namespace idem::store
