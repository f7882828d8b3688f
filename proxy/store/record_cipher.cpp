// AES-256-GCM sealing of stored answers (record_cipher.hpp).
#include "store/record_cipher.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace idem::store {
namespace {

constexpr std::string_view kMagic("\0IDEMENC", 8);
constexpr std::uint8_t kVersion = 1;
constexpr std::size_t kNonce = 12;
constexpr std::size_t kTag = 16;
constexpr std::string_view kSealedHeader = ":sealed";

void put_u32(std::string& out, std::size_t n) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((n >> shift) & 0xff);
}

bool get_u32(std::string_view& in, std::size_t& n) {
  if (in.size() < 4) return false;
  n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(in[static_cast<std::size_t>(i)]);
  in.remove_prefix(4);
  return true;
}

void put_string(std::string& out, std::string_view s) {
  put_u32(out, s.size());
  out += s;
}

bool get_string(std::string_view& in, std::string& s) {
  std::size_t n = 0;
  if (!get_u32(in, n) || in.size() < n) return false;
  s.assign(in.substr(0, n));
  in.remove_prefix(n);
  return true;
}

std::string associated_data(const RecordId& id, int status, std::string_view part) {
  std::string ad = "idemproxy-record/1";
  put_string(ad, part);
  put_string(ad, id.tenant);
  put_string(ad, id.endpoint);
  put_string(ad, id.key);
  put_string(ad, std::to_string(status));
  return ad;
}

std::string serialize_headers(const std::vector<StoredHeader>& headers) {
  std::string out;
  put_u32(out, headers.size());
  for (const auto& h : headers) {
    put_string(out, h.name);
    put_string(out, h.value);
  }
  return out;
}

std::optional<std::vector<StoredHeader>> parse_headers(std::string_view in) {
  std::size_t n = 0;
  if (!get_u32(in, n) || n > in.size()) return std::nullopt;
  std::vector<StoredHeader> out(n);
  for (auto& h : out) {
    if (!get_string(in, h.name) || !get_string(in, h.value)) return std::nullopt;
  }
  if (!in.empty()) return std::nullopt;
  return out;
}

struct CipherCtx {
  EVP_CIPHER_CTX* p = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(p); }
};

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }
unsigned char* bytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

// The synthetic nonce: HMAC-SHA256(nonce key, ad || plaintext), truncated. The nonce key
// is HMAC-SHA256(key, "idemproxy nonce key"), so it is never the encryption key itself.
std::array<std::uint8_t, kNonce> synthetic_nonce(const EncryptionKey& key, std::string_view ad,
                                                 std::string_view plaintext) {
  unsigned char nonce_key[32];
  unsigned int len = 0;
  static constexpr std::string_view kLabel = "idemproxy nonce key";
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), bytes(kLabel), kLabel.size(), nonce_key, &len);
  std::string input;
  put_string(input, ad);
  input += plaintext;
  unsigned char mac[32];
  HMAC(EVP_sha256(), nonce_key, sizeof nonce_key, bytes(input), input.size(), mac, &len);
  std::array<std::uint8_t, kNonce> nonce{};
  std::memcpy(nonce.data(), mac, kNonce);
  return nonce;
}

std::string seal_part(const std::string& key_id, const EncryptionKey& key, std::string_view ad,
                      std::string_view plaintext) {
  const auto nonce = synthetic_nonce(key, ad, plaintext);
  std::string out(kMagic);
  out += static_cast<char>(kVersion);
  out += static_cast<char>(key_id.size());
  out += key_id;
  out.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  const auto header = out.size();
  out.resize(header + plaintext.size() + kTag);
  CipherCtx ctx;
  int n = 0;
  int total = 0;
  if (ctx.p == nullptr ||
      EVP_EncryptInit_ex(ctx.p, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_SET_IVLEN, kNonce, nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx.p, nullptr, nullptr, key.data(), nonce.data()) != 1 ||
      EVP_EncryptUpdate(ctx.p, nullptr, &n, bytes(ad), static_cast<int>(ad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.p, bytes(out) + header, &n, bytes(plaintext), static_cast<int>(plaintext.size())) != 1) {
    throw std::runtime_error("AES-256-GCM encryption failed");
  }
  total = n;
  if (EVP_EncryptFinal_ex(ctx.p, bytes(out) + header + total, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_GET_TAG, kTag, bytes(out) + header + plaintext.size()) != 1) {
    throw std::runtime_error("AES-256-GCM encryption failed");
  }
  return out;
}

struct Sealed {
  std::string key_id;
  std::string_view nonce;
  std::string_view ciphertext;
  std::string_view tag;
};

std::optional<Sealed> split(std::string_view s) {
  if (!is_sealed(s) || s.size() < kMagic.size() + 2) return std::nullopt;
  s.remove_prefix(kMagic.size());
  if (static_cast<std::uint8_t>(s[0]) != kVersion) return std::nullopt;
  const auto id_len = static_cast<std::uint8_t>(s[1]);
  s.remove_prefix(2);
  if (s.size() < id_len + kNonce + kTag) return std::nullopt;
  Sealed out;
  out.key_id.assign(s.substr(0, id_len));
  s.remove_prefix(id_len);
  out.nonce = s.substr(0, kNonce);
  s.remove_prefix(kNonce);
  out.ciphertext = s.substr(0, s.size() - kTag);
  out.tag = s.substr(s.size() - kTag);
  return out;
}

std::optional<std::string> open_part(const KeyRing& ring, std::string_view sealed, std::string_view ad,
                                     OpenError* why) {
  auto fail = [&](OpenError e) -> std::optional<std::string> {
    if (why != nullptr) *why = e;
    return std::nullopt;
  };
  const auto parts = split(sealed);
  if (!parts) return fail(OpenError::invalid);
  const auto* key = ring.find(parts->key_id);
  if (key == nullptr) return fail(OpenError::unknown_key);
  std::string out(parts->ciphertext.size(), '\0');
  std::string tag(parts->tag);
  CipherCtx ctx;
  int n = 0;
  if (ctx.p == nullptr ||
      EVP_DecryptInit_ex(ctx.p, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_SET_IVLEN, kNonce, nullptr) != 1 ||
      EVP_DecryptInit_ex(ctx.p, nullptr, nullptr, key->data(), bytes(parts->nonce)) != 1 ||
      EVP_DecryptUpdate(ctx.p, nullptr, &n, bytes(ad), static_cast<int>(ad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.p, bytes(out), &n, bytes(parts->ciphertext),
                        static_cast<int>(parts->ciphertext.size())) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.p, EVP_CTRL_GCM_SET_TAG, kTag, tag.data()) != 1) {
    return fail(OpenError::invalid);
  }
  int last = 0;
  // The tag check: a wrong key, another record's associated data or any changed byte.
  if (EVP_DecryptFinal_ex(ctx.p, bytes(out) + n, &last) != 1) return fail(OpenError::invalid);
  return out;
}

bool valid_key_id(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
         });
}

std::string base64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(bytes(out), bytes(in), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::optional<std::string> unbase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(bytes(out), bytes(in), static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts padding as zero bytes.
  std::size_t len = static_cast<std::size_t>(n);
  if (!in.empty() && in.back() == '=') --len;
  if (in.size() >= 2 && in[in.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

}  // namespace

KeyRing::KeyRing(std::map<std::string, EncryptionKey> keys, std::string active)
    : keys_(keys.begin(), keys.end()), active_(std::move(active)) {
  for (const auto& [id, key] : keys_) {
    if (!valid_key_id(id)) throw std::invalid_argument("key id '" + id + "' is not 1-64 of A-Z a-z 0-9 . _ -");
  }
  if (keys_.find(active_) == keys_.end()) {
    throw std::invalid_argument("the active key '" + active_ + "' is not among the keys");
  }
}

const EncryptionKey* KeyRing::find(std::string_view id) const {
  const auto it = keys_.find(id);
  return it == keys_.end() ? nullptr : &it->second;
}

EncryptionKey parse_key_file(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  EncryptionKey key{};
  if (text.size() == 64) {
    auto hex = [](char c) {
      return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    bool ok = true;
    for (std::size_t i = 0; i < 32 && ok; ++i) {
      const int hi = hex(text[2 * i]);
      const int lo = hex(text[2 * i + 1]);
      ok = hi >= 0 && lo >= 0;
      key[i] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    if (ok) return key;
  }
  if (text.size() == 44) {
    if (auto raw = unbase64(text); raw && raw->size() == 32) {
      std::memcpy(key.data(), raw->data(), 32);
      return key;
    }
  }
  throw std::invalid_argument("a key file must hold 32 bytes as 64 hex digits or 44 base64 characters");
}

bool is_sealed(std::string_view body) noexcept { return body.substr(0, kMagic.size()) == kMagic; }

StoredResponse seal(const KeyRing& ring, const RecordId& id, const StoredResponse& response) {
  StoredResponse out = response;
  const auto& key_id = ring.active_id();
  const auto& key = ring.active();
  out.headers = {StoredHeader{std::string(kSealedHeader),
                              base64(seal_part(key_id, key, associated_data(id, response.status, "headers"),
                                               serialize_headers(response.headers)))}};
  if (!response.body_omitted) {
    out.body = seal_part(key_id, key, associated_data(id, response.status, "body"), response.body);
  }
  return out;
}

std::optional<std::string> sealed_key_id(std::string_view body) {
  auto parts = split(body);
  if (!parts) return std::nullopt;
  return parts->key_id;
}

std::optional<StoredResponse> open(const KeyRing& ring, const RecordId& id, const StoredResponse& stored,
                                   OpenError* why) {
  const bool sealed_headers = stored.headers.size() == 1 && stored.headers[0].name == kSealedHeader;
  if (!sealed_headers && !is_sealed(stored.body)) return stored;  // written in clear
  StoredResponse out = stored;
  auto invalid = [&]() -> std::optional<StoredResponse> {
    if (why != nullptr) *why = OpenError::invalid;
    return std::nullopt;
  };
  // Half sealed is not a record this code wrote: refuse it rather than guess.
  if (!sealed_headers || (stored.body_omitted ? !stored.body.empty() : !is_sealed(stored.body))) return invalid();
  const auto raw = unbase64(stored.headers[0].value);
  if (!raw) return invalid();
  const auto list = open_part(ring, *raw, associated_data(id, stored.status, "headers"), why);
  if (!list) return std::nullopt;
  auto headers = parse_headers(*list);
  if (!headers) return invalid();
  out.headers = std::move(*headers);
  if (!stored.body_omitted) {
    auto body = open_part(ring, stored.body, associated_data(id, stored.status, "body"), why);
    if (!body) return std::nullopt;
    out.body = std::move(*body);
  }
  return out;
}

}  // namespace idem::store
