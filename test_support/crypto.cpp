#include "test_support/crypto.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <stdexcept>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509v3.h>

#include "test_support/wait.hpp"

namespace idem::test {
namespace {

std::string b64url(std::string_view bytes) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : bytes) {
    acc = (acc << 8) | static_cast<unsigned char>(c);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(acc >> bits) & 0x3f];
    }
  }
  if (bits > 0) out += kAlphabet[(acc << (6 - bits)) & 0x3f];
  return out;
}

void check(bool ok, std::string_view what) {
  if (!ok) throw Failure("OpenSSL: " + std::string(what) + " failed");
}

std::string bn_bytes(const BIGNUM* bn, int width = 0) {
  const int size = std::max(width, BN_num_bytes(bn));
  std::string out(static_cast<std::size_t>(size), '\0');
  check(BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), size) == size, "BN_bn2binpad");
  return out;
}

std::string bn_param(EVP_PKEY* key, const char* name, int width = 0) {
  BIGNUM* bn = nullptr;
  check(EVP_PKEY_get_bn_param(key, name, &bn) == 1, name);
  auto out = bn_bytes(bn, width);
  BN_free(bn);
  return out;
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<std::size_t>(n));
}

int coordinate_bytes(std::string_view curve) { return curve == "P-256" ? 32 : curve == "P-384" ? 48 : 66; }

const EVP_MD* digest_of(std::string_view alg) {
  const auto bits = alg.substr(2);
  if (bits == "256") return EVP_sha256();
  if (bits == "384") return EVP_sha384();
  if (bits == "512") return EVP_sha512();
  throw Failure("sign_jwt: unknown algorithm " + std::string(alg));
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  check(ext != nullptr, "X509V3_EXT_conf_nid");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

std::string pem_of(X509* cert) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  check(PEM_write_bio_X509(bio.get(), cert) == 1, "PEM_write_bio_X509");
  return bio_text(bio.get());
}

std::atomic<long> g_serial{1000};

std::shared_ptr<X509> new_cert(EVP_PKEY* subject_key, std::string_view common_name,
                               std::chrono::seconds not_before, std::chrono::seconds not_after) {
  std::shared_ptr<X509> cert(X509_new(), X509_free);
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), g_serial.fetch_add(1) + ::getpid() * 100000L);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), static_cast<long>(not_before.count()));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(not_after.count()));
  X509_set_pubkey(cert.get(), subject_key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(std::string(common_name).c_str()), -1, -1, 0);
  return cert;
}

}  // namespace

KeyPair KeyPair::rsa(int bits) {
  KeyPair k;
  k.key_.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(bits)), EVP_PKEY_free);
  check(k.key_ != nullptr, "RSA keygen");
  return k;
}

KeyPair KeyPair::ec(std::string_view curve) {
  const char* name = curve == "P-256" ? "P-256" : curve == "P-384" ? "P-384" : "P-521";
  KeyPair k;
  k.key_.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", name), EVP_PKEY_free);
  check(k.key_ != nullptr, "EC keygen");
  k.curve_ = std::string(curve);
  return k;
}

std::string KeyPair::public_jwk(std::string_view kid, std::string_view alg) const {
  std::string out = "{";
  if (is_ec()) {
    const int w = coordinate_bytes(curve_);
    out += "\"kty\":\"EC\",\"crv\":\"" + curve_ + "\",\"x\":\"" +
           b64url(bn_param(key_.get(), OSSL_PKEY_PARAM_EC_PUB_X, w)) + "\",\"y\":\"" +
           b64url(bn_param(key_.get(), OSSL_PKEY_PARAM_EC_PUB_Y, w)) + "\"";
  } else {
    out += "\"kty\":\"RSA\",\"n\":\"" + b64url(bn_param(key_.get(), OSSL_PKEY_PARAM_RSA_N)) +
           "\",\"e\":\"" + b64url(bn_param(key_.get(), OSSL_PKEY_PARAM_RSA_E)) + "\"";
  }
  out += ",\"kid\":\"" + std::string(kid) + "\",\"use\":\"sig\"";
  if (!alg.empty()) out += ",\"alg\":\"" + std::string(alg) + "\"";
  return out + "}";
}

std::string KeyPair::private_pem() const {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  check(PEM_write_bio_PrivateKey(bio.get(), key_.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM_write_bio_PrivateKey");
  return bio_text(bio.get());
}

std::string jwks(const std::vector<std::string>& jwk_objects) {
  std::string out = "{\"keys\":[";
  for (std::size_t i = 0; i < jwk_objects.size(); ++i) out += (i ? "," : "") + jwk_objects[i];
  return out + "]}";
}

std::string sign_jwt(std::string_view header_json, std::string_view payload_json, const KeyPair& key,
                     std::string_view alg) {
  const std::string signing_input = b64url(header_json) + "." + b64url(payload_json);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_PKEY_CTX* pctx = nullptr;
  check(EVP_DigestSignInit(md.get(), &pctx, digest_of(alg), nullptr, key.get()) == 1, "DigestSignInit");
  if (alg.substr(0, 2) == "PS") {
    check(EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1, "PSS padding");
    check(EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1, "PSS salt");
  }
  std::size_t len = 0;
  const auto* in = reinterpret_cast<const unsigned char*>(signing_input.data());
  check(EVP_DigestSign(md.get(), nullptr, &len, in, signing_input.size()) == 1, "DigestSign size");
  std::string sig(len, '\0');
  check(EVP_DigestSign(md.get(), reinterpret_cast<unsigned char*>(sig.data()), &len, in,
                       signing_input.size()) == 1,
        "DigestSign");
  sig.resize(len);
  if (alg.substr(0, 2) == "ES") {
    // DER -> R || S, each of the curve's size (RFC 7518 §3.4).
    const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    check(es != nullptr, "d2i_ECDSA_SIG");
    const int w = alg == "ES256" ? 32 : alg == "ES384" ? 48 : 66;
    sig = bn_bytes(ECDSA_SIG_get0_r(es), w) + bn_bytes(ECDSA_SIG_get0_s(es), w);
    ECDSA_SIG_free(es);
  }
  return signing_input + "." + b64url(sig);
}

std::string unsigned_jwt(std::string_view header_json, std::string_view payload_json,
                         std::string_view signature) {
  return b64url(header_json) + "." + b64url(payload_json) + "." + b64url(signature);
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

CertificateAuthority::CertificateAuthority(std::string_view name) : key_(KeyPair::ec("P-256")) {
  cert_ = new_cert(key_.get(), name, -std::chrono::hours(2), std::chrono::hours(48));
  X509_set_issuer_name(cert_.get(), X509_get_subject_name(cert_.get()));
  add_extension(cert_.get(), cert_.get(), NID_basic_constraints, "critical,CA:TRUE");
  add_extension(cert_.get(), cert_.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert_.get(), cert_.get(), NID_subject_key_identifier, "hash");
  check(X509_sign(cert_.get(), key_.get(), EVP_sha256()) > 0, "X509_sign (CA)");
  cert_pem_ = pem_of(cert_.get());
}

Certificate CertificateAuthority::issue(const CertificateOptions& o) const {
  const KeyPair leaf_key = KeyPair::ec("P-256");
  auto cert = new_cert(leaf_key.get(), o.common_name, o.not_before, o.not_after);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert_.get()));
  add_extension(cert.get(), cert_.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert.get(), cert_.get(), NID_key_usage, "critical,digitalSignature");
  add_extension(cert.get(), cert_.get(), NID_ext_key_usage, o.server ? "serverAuth" : "clientAuth");
  add_extension(cert.get(), cert_.get(), NID_authority_key_identifier, "keyid");
  std::string san;
  for (const auto& d : o.dns) san += (san.empty() ? "" : ",") + std::string("DNS:") + d;
  for (const auto& ip : o.ips) san += (san.empty() ? "" : ",") + std::string("IP:") + ip;
  for (const auto& u : o.uris) san += (san.empty() ? "" : ",") + std::string("URI:") + u;
  if (!san.empty()) add_extension(cert.get(), cert_.get(), NID_subject_alt_name, san);
  check(X509_sign(cert.get(), key_.get(), EVP_sha256()) > 0, "X509_sign");
  return Certificate{pem_of(cert.get()), leaf_key.private_pem()};
}

std::string write_file(const std::filesystem::path& dir, std::string_view name, std::string_view text) {
  const auto path = dir / std::string(name);
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw Failure("cannot write " + tmp);
  }
  ::chmod(tmp.c_str(), S_IRUSR | S_IWUSR);
  // Renamed into place: a reader (a reload) sees the old file or the new one, never half.
  std::filesystem::rename(tmp, path);
  return path.string();
}

}  // namespace idem::test
