// The encryption section: keys with unique ids, an active id among them, paths only in
// the rendered configuration.
#include <doctest/doctest.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;

TEST_CASE("encryption: off by default; keys and the active id") {
  CHECK(load(kMinimal)->encryption.keys.empty());
  const auto s = load(kMinimal +
                      "encryption:\n  keys:\n    - {id: k-2026.01, file: /keys/a}\n    - {id: k2, file: /keys/b}\n"
                      "  active: k2\n");
  REQUIRE(s->encryption.keys.size() == 2);
  CHECK(s->encryption.keys[0].id == "k-2026.01");
  CHECK(s->encryption.keys[1].file == "/keys/b");
  CHECK(s->encryption.active == "k2");
  const auto text = render_effective(*s);
  CHECK(text.find("encryption:\n  keys: [{id: \"k-2026.01\", file: \"/keys/a\"}, {id: \"k2\", file: \"/keys/b\"}]\n"
                  "  active: \"k2\"\n") != std::string::npos);
  CHECK(render_effective(*load(text)) == text);
}

TEST_CASE("encryption: refusals name the key") {
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys: []\n  active: k\n", 6, "encryption.keys", "non-empty");
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys:\n    - {id: k, file: /a}\n    - {id: k, file: /b}\n  active: k\n",
                     8, "encryption.keys[1].id", "listed twice");
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys:\n    - {id: k, file: /a}\n  active: other\n", 8,
                     "encryption.active", "not the id of one of encryption.keys");
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys:\n    - {id: \"a b\", file: /a}\n  active: \"a b\"\n", 7,
                     "encryption.keys[0].id", "1-64 of");
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys:\n    - {id: k}\n  active: k\n", 7, "encryption.keys[0].file",
                     "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + "encryption:\n  keys:\n    - {id: k, file: /a}\n", 5, "encryption.active",
                     "missing required key");
}

TEST_CASE("encryption: a completion: backend route (clear records) needs allow_clear_backend_records") {
  const std::string keys = "encryption:\n  keys:\n    - {id: k, file: /a}\n  active: k\n";
  const std::string routes =
      "routes:\n"
      "  - name: plain\n    method: POST\n    path: /payments\n"
      "  - name: create-order\n    method: POST\n    path: /orders\n    completion: backend\n";
  CHECK_CONFIG_ERROR(kMinimal + keys + routes, 16, "routes[1].completion", "stores this route's answers in clear");
  const auto f = failure(kMinimal + keys + routes);
  CHECK(f.what.find("in clear") != std::string::npos);
  CHECK(f.what.find("encryption.allow_clear_backend_records: true") != std::string::npos);
  // Each alone is fine; so is the pair with the opt-in, which renders and reads back.
  CHECK(load(kMinimal + routes)->routes[1].completion == Completion::backend);
  CHECK_FALSE(load(kMinimal + keys)->encryption.allow_clear_backend_records);
  const auto s = load(kMinimal + keys + "  allow_clear_backend_records: true\n" + routes);
  CHECK(s->encryption.allow_clear_backend_records);
  const auto text = render_effective(*s);
  CHECK(text.find("  allow_clear_backend_records: true\n") != std::string::npos);
  CHECK(render_effective(*load(text)) == text);
  // Written false, it refuses as if absent; it is a boolean.
  CHECK_CONFIG_ERROR(kMinimal + keys + "  allow_clear_backend_records: false\n" + routes, 17,
                     "routes[1].completion", "in clear");
  CHECK_CONFIG_ERROR(kMinimal + keys + "  allow_clear_backend_records: maybe\n", 9,
                     "encryption.allow_clear_backend_records", "expected true or false");
}
