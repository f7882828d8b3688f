#pragma once
// OpenSSL's per-thread error queue as one line of text, for error messages and logs. Used
// by both TLS sides (server/tls.cpp, upstream/tls.cpp).
#include <string>

namespace idem {

// The queued errors, oldest first, joined by "; " ("unknown error" when the queue is
// empty); the queue is cleared, so a later failure does not report this one's causes.
std::string openssl_errors();

}  // namespace idem
