#pragma once
// `idemproxy routes --openapi FILE`: a proposed `routes:` block from an OpenAPI 3.0 or 3.1
// document (YAML or JSON), one route per operation that declares an idempotency-key
// header parameter (a header whose name contains "idempotency"), or per POST with
// `all_posts`. What the document says is carried over — the path template, the key
// header's name, `required` and `maxLength`, the body's media type (json, form, else raw),
// its top-level properties as fingerprint fields with their `default`s, the documented
// `Location` / `ETag` response headers as replay_headers — and every choice the proposal
// made (a field left out as readOnly or as a trace or timing field, a key assumed) is a
// YAML comment beside it. The output loads with check-config once placed in a config.
// Lives in settings/ because it reads YAML (settings/ is the only yaml-cpp user).
#include <string>

#include "settings/settings.hpp"

namespace idem::settings {

struct OpenApiOptions {
  bool all_posts = false;  // every POST, whether or not it declares a key header
};

// The proposal's YAML text. Throws ConfigError naming the file, the line and the
// operation for what it cannot read: not OpenAPI 3 (Swagger 2.0 included), a `$ref`
// outside the document or to nothing, a request body without a schema.
std::string propose_routes(const std::string& path, const OpenApiOptions& options = {});
// The same from the document's text; `name` stands for the file in messages.
std::string propose_routes_text(const std::string& text, const std::string& name,
                                const OpenApiOptions& options = {});

}  // namespace idem::settings
