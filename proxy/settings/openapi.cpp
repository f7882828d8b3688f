// Routes proposed from an OpenAPI document (settings/openapi.hpp). The document is only
// read: every node is accessed through const references, since yaml-cpp's non-const
// operator[] would insert what it looks up.
#include "settings/openapi.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/text.hpp"
#include "settings/detail.hpp"

namespace idem::settings {
namespace {

using detail::json_quote;

struct Doc {
  YAML::Node root;
  std::string name;
};

int line_of(const YAML::Node& n) { return n.IsDefined() && n.Mark().line >= 0 ? n.Mark().line + 1 : 0; }

[[noreturn]] void fail(const Doc& d, const YAML::Node& at, const std::string& where, const std::string& message) {
  throw ConfigError(d.name, line_of(at), where, message);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A member of a mapping; undefined when `n` is no mapping or lacks it (yaml-cpp throws on
// any lookup in an undefined node, and the document may be shaped any way).
YAML::Node get(const YAML::Node& n, const std::string& key) {
  if (!n.IsDefined() || !n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node found = n[key];
  return found.IsDefined() ? found : YAML::Node(YAML::NodeType::Undefined);
}

std::string scalar(const YAML::Node& n) { return n.IsDefined() && n.IsScalar() ? n.Scalar() : std::string(); }

// A JSON Pointer segment of a `$ref` ("#/components/schemas/Order"), ~1 and ~0 unescaped.
std::string unescape_segment(std::string s) {
  for (std::size_t at = 0; (at = s.find('~', at)) != std::string::npos; ++at) {
    if (at + 1 < s.size() && s[at + 1] == '1') s.replace(at, 2, "/");
    else if (at + 1 < s.size() && s[at + 1] == '0') s.replace(at, 2, "~");
  }
  return s;
}

// The node a `$ref` chain ends at. Only references inside the document ("#/...") are
// followed: an external file or URL is not read, and a proposal from half a document
// would be a guess.
YAML::Node resolve(const Doc& d, const YAML::Node& n, const std::string& where) {
  YAML::Node at = n;
  for (int depth = 0; at.IsMap() && get(at, "$ref"); ++depth) {
    const auto ref = scalar(get(at, "$ref"));
    if (depth > 32) fail(d, at, where, "a cycle of $ref ends at '" + ref + "'");
    if (ref.rfind("#/", 0) != 0) {
      fail(d, at, where, "$ref '" + ref + "' points outside this document; bundle the document "
                         "first (e.g. `redocly bundle`), external references are not read");
    }
    YAML::Node target = d.root;
    std::stringstream segments(ref.substr(2));
    for (std::string seg; std::getline(segments, seg, '/');) {
      const YAML::Node& parent = target;
      const YAML::Node next = get(parent, unescape_segment(seg));
      if (!next.IsDefined() || next.IsNull()) fail(d, at, where, "$ref '" + ref + "' names nothing in this document");
      target.reset(next);
    }
    at.reset(target);
  }
  return at;
}

std::string pointer_of(const std::string& member) {
  std::string out = "/";
  for (char c : member) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A schema's `default` as the JSON text fingerprint.defaults takes: a quoted scalar is a
// string, a plain one a number, boolean or null when it reads as one.
std::string json_of(const YAML::Node& n) {
  if (n.IsNull()) return "null";
  if (n.IsSequence()) {
    std::string out = "[";
    for (std::size_t i = 0; i < n.size(); ++i) out += (i ? "," : "") + json_of(n[i]);
    return out + "]";
  }
  if (n.IsMap()) {
    std::set<std::pair<std::string, std::string>> members;
    for (const auto& kv : n) members.emplace(kv.first.Scalar(), json_of(kv.second));
    std::string out = "{";
    for (const auto& [k, v] : members) out += (out.size() > 1 ? "," : "") + json_quote(k) + ":" + v;
    return out + "}";
  }
  const auto& s = n.Scalar();
  if (n.Tag() != "!" && (s == "true" || s == "false" || s == "null" || detail::is_json_number(s))) return s;
  return json_quote(s);
}

// Members that describe the message rather than the operation: a retry may change them.
bool looks_incidental(const std::string& name) {
  std::string n;
  for (char c : lower(name)) {
    if (c != '_' && c != '-') n += c;
  }
  static const std::set<std::string> kNames = {"traceid", "spanid", "traceparent", "requestid", "correlationid",
                                               "clientsentat", "sentat", "timestamp", "clienttimestamp",
                                               "requesttime"};
  return kNames.count(n) != 0;
}

struct Operation {
  std::string method;  // upper case
  std::string path;
  std::string where;   // "paths./orders.post", for messages
  YAML::Node node;
  YAML::Node path_item;
};

struct Lines {
  std::ostringstream out;
  void put(int indent, const std::string& text) { out << std::string(static_cast<std::size_t>(indent), ' ') << text << '\n'; }
};

// The operation's idempotency-key header parameter, operation-level first (it overrides
// the path item's, OpenAPI 3 §4.8.10).
YAML::Node key_parameter(const Doc& d, const Operation& op) {
  for (const YAML::Node& owner : {op.node, op.path_item}) {
    const YAML::Node params = get(owner, "parameters");
    if (!params.IsSequence()) continue;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto p = resolve(d, params[i], op.where + ".parameters");
      if (lower(scalar(get(p, "in"))) == "header" && lower(scalar(get(p, "name"))).find("idempotency") != std::string::npos) {
        return p;
      }
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

void write_key(const Doc& d, const Operation& op, const YAML::Node& param, Lines& l) {
  l.put(4, "key:");
  if (!param.IsDefined()) {
    l.put(6, "# the document declares no idempotency-key header here: the default header is");
    l.put(6, "# assumed; clients must send it, or set required: false to let key-less requests pass");
    l.put(6, "header: Idempotency-Key");
    l.put(6, "required: true");
    return;
  }
  l.put(6, "header: " + json_quote(scalar(get(param, "name"))));
  const bool required = scalar(get(param, "required")) == "true";
  if (!required) l.put(6, "# the parameter is optional in the document: requests without it pass through unprotected");
  l.put(6, std::string("required: ") + (required ? "true" : "false"));
  const auto schema = resolve(d, get(param, "schema"), op.where + ".parameters");
  const auto max = scalar(get(schema, "maxLength"));
  if (!max.empty() && std::all_of(max.begin(), max.end(), ::isdigit) && max.size() < 6) {
    const auto n = std::stoul(max);
    if (n >= 1 && n <= 1024) l.put(6, "max_length: " + max);
    else l.put(6, "# maxLength " + max + " is outside 1..1024: the default max_length (255) applies");
  }
}

// The body's properties, merged over allOf, in document order.
void collect_properties(const Doc& d, const YAML::Node& schema, const std::string& where,
                        std::vector<std::pair<std::string, YAML::Node>>& out, int depth = 0) {
  if (depth > 16) fail(d, schema, where, "allOf nests too deep");
  const YAML::Node all = get(schema, "allOf");
  if (all.IsSequence()) {
    for (std::size_t i = 0; i < all.size(); ++i) collect_properties(d, resolve(d, all[i], where), where, out, depth + 1);
  }
  const YAML::Node props = get(schema, "properties");
  if (!props.IsMap()) return;
  for (const auto& kv : props) out.emplace_back(kv.first.Scalar(), resolve(d, kv.second, where));
}

void write_fields(const Doc& d, const Operation& op, const YAML::Node& schema, Lines& l) {
  std::vector<std::pair<std::string, YAML::Node>> props;
  collect_properties(d, schema, op.where + ".requestBody", props);
  if (props.empty()) {
    l.put(6, "# the body schema names no top-level properties: the whole body is fingerprinted");
    return;
  }
  std::vector<std::string> fields, notes, defaults;
  std::set<std::string> seen;
  for (const auto& [name, prop] : props) {
    if (!seen.insert(name).second) continue;
    const auto ptr = pointer_of(name);
    if (scalar(get(prop, "readOnly")) == "true") {
      notes.push_back("# " + ptr + " left out: readOnly in the schema (the server sets it)");
    } else if (lower(name).find("idempotency") != std::string::npos) {
      notes.push_back("# " + ptr + " left out: it looks like a key in the body; if clients send the key");
      notes.push_back("#   there, use key: {from: body, pointer: " + json_quote(ptr) + "}");
    } else if (looks_incidental(name)) {
      notes.push_back("# " + ptr + " left out: a trace or timing member, not part of the operation");
    } else {
      fields.push_back(json_quote(ptr));
      if (get(prop, "default").IsDefined()) defaults.push_back(json_quote(ptr) + ": " + json_of(get(prop, "default")));
    }
  }
  std::string list;
  for (const auto& f : fields) list += (list.empty() ? "" : ", ") + f;
  l.put(6, "fields: [" + list + "]");
  for (const auto& n : notes) l.put(6, n);
  if (!defaults.empty()) {
    std::string map;
    for (const auto& v : defaults) map += (map.empty() ? "" : ", ") + v;
    l.put(6, "defaults: { " + map + " }");
  }
}

bool is_json_media(const std::string& type) {
  return type == "application/json" || (type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0);
}

void write_fingerprint(const Doc& d, const Operation& op, Lines& l) {
  l.put(4, "fingerprint:");
  const auto body = resolve(d, get(op.node, "requestBody"), op.where + ".requestBody");
  const YAML::Node content = get(body, "content");
  if (!body.IsDefined() || !content.IsMap() || content.size() == 0) {
    l.put(6, "# no request body is documented: its bytes (none, normally) are fingerprinted as they are");
    l.put(6, "format: raw");
    return;
  }
  std::string json, form, other;
  for (const auto& kv : content) {
    const auto type = lower(kv.first.Scalar().substr(0, kv.first.Scalar().find(';')));
    if (is_json_media(type) && json.empty()) json = kv.first.Scalar();
    else if (type == "application/x-www-form-urlencoded" && form.empty()) form = kv.first.Scalar();
    else if (other.empty()) other = type;
  }
  const auto chosen = !json.empty() ? json : !form.empty() ? form : other;
  if (chosen.rfind("multipart/", 0) == 0) {
    fail(d, content, op.where + ".requestBody", "a multipart body cannot be fingerprinted (its boundary changes per request)");
  }
  if (content.size() > 1) {
    l.put(6, "# the body is documented in " + std::to_string(content.size()) + " media types; a route reads one format: " + chosen);
  }
  const auto schema = resolve(d, get(get(content, chosen), "schema"), op.where + ".requestBody");
  if (!schema.IsDefined() || schema.IsNull()) {
    fail(d, get(content, chosen), op.where + ".requestBody.content." + chosen,
         "the request body (" + chosen + ") has no schema: say which members make the operation, or write the route by hand");
  }
  if (!json.empty()) {
    l.put(6, "format: json");
  } else if (!form.empty()) {
    l.put(6, "format: form");
  } else {
    l.put(6, "format: raw");
    l.put(6, "media_types: [" + json_quote(other) + "]");
    l.put(6, "# a raw body is fingerprinted as its exact bytes: its schema cannot select fields");
    return;
  }
  write_fields(d, op, schema, l);
}

void write_replay_headers(const Doc& d, const Operation& op, Lines& l) {
  std::vector<std::string> replay = {"Content-Type"};
  std::set<std::string> others;
  const YAML::Node responses = get(op.node, "responses");
  if (responses.IsMap()) {
    for (const auto& kv : responses) {
      const auto res = resolve(d, kv.second, op.where + ".responses");
      const YAML::Node headers = get(res, "headers");
      if (!headers.IsMap()) continue;
      for (const auto& h : headers) {
        const auto name = h.first.Scalar();
        const auto ln = lower(name);
        if (ln == "location" || ln == "etag") {
          const std::string canonical = ln == "location" ? "Location" : "ETag";
          if (std::find(replay.begin(), replay.end(), canonical) == replay.end()) replay.push_back(canonical);
        } else {
          others.insert(name);
        }
      }
    }
  }
  std::string list;
  for (const auto& h : replay) list += (list.empty() ? "" : ", ") + h;
  l.put(4, "replay_headers: [" + list + "]");
  if (!others.empty()) {
    std::string names;
    for (const auto& h : others) names += (names.empty() ? "" : ", ") + h;
    l.put(4, "# also documented, not replayed (add them if a retry must see them): " + names);
  }
}

std::string route_name(const Operation& op, std::set<std::string>& taken) {
  std::string base;
  for (char c : scalar(get(op.node, "operationId"))) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') base += c;
  }
  if (base.empty()) {
    base = lower(op.method);
    for (char c : op.path) {
      if (std::isalnum(static_cast<unsigned char>(c))) base += c;
      else if (base.back() != '-') base += '-';
    }
    while (base.size() > 1 && base.back() == '-') base.pop_back();
  }
  base = base.substr(0, 60);
  std::string name = base;
  for (int n = 2; !taken.insert(name).second; ++n) name = base + "-" + std::to_string(n);
  return name;
}

void write_route(const Doc& d, const Operation& op, const YAML::Node& key, std::set<std::string>& names, Lines& l) {
  try {
    detail::check_route_path(op.path);
  } catch (const std::exception& e) {
    l.put(2, "# " + op.method + " " + op.path + ": not proposed, its path cannot be a route path (" + e.what() + ")");
    return;
  }
  const auto id = scalar(get(op.node, "operationId"));
  l.put(2, "# " + op.method + " " + op.path + (id.empty() ? "" : " (operationId " + id + ")") +
               (key.IsDefined() ? ": declares the " + scalar(get(key, "name")) + " header" : ": a POST (--all-posts)"));
  l.put(2, "- name: " + json_quote(route_name(op, names)));
  l.put(4, "method: " + op.method);
  l.put(4, "path: " + json_quote(op.path));
  write_key(d, op, key, l);
  write_fingerprint(d, op, l);
  write_replay_headers(d, op, l);
}

void check_version(const Doc& d) {
  const auto& root = d.root;
  if (!root.IsMap()) fail(d, root, "", "not an OpenAPI document (expected a mapping at the top)");
  if (get(root, "swagger")) {
    fail(d, get(root, "swagger"), "swagger", "Swagger " + scalar(get(root, "swagger")) +
                                           " is not supported: convert the document to OpenAPI 3 first");
  }
  const auto version = scalar(get(root, "openapi"));
  if (version.rfind("3.0", 0) != 0 && version.rfind("3.1", 0) != 0) {
    fail(d, get(root, "openapi"), "openapi", version.empty() ? "no 'openapi' version: not an OpenAPI 3 document"
                                                        : "OpenAPI " + version + " is not supported (3.0 and 3.1 are)");
  }
}

}  // namespace

std::string propose_routes_text(const std::string& text, const std::string& name, const OpenApiOptions& options) {
  Doc d;
  d.name = name;
  try {
    d.root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(name, e.mark.line + 1, "", "not YAML or JSON: " + e.msg);
  }
  check_version(d);
  const YAML::Node& root = d.root;
  Lines l;
  l.put(0, "# Routes proposed by `idemproxy routes --openapi` from " + name + " (" + scalar(get(get(root, "info"), "title")) +
               " " + scalar(get(get(root, "info"), "version")) + ", OpenAPI " + scalar(get(root, "openapi")) + ").");
  l.put(0, "# Review each route: every choice made for you is a comment beside it.");
  std::set<std::string> names;
  Lines routes;
  const YAML::Node paths = get(root, "paths");
  for (const auto& kv : paths.IsMap() ? paths : YAML::Node(YAML::NodeType::Map)) {
    const auto path = kv.first.Scalar();
    const auto item = resolve(d, kv.second, "paths." + path);
    for (const char* method : {"post", "put", "patch", "delete", "get"}) {
      const YAML::Node node = get(item, method);
      if (!node.IsMap()) continue;
      Operation op{idem::text::uppercase(method), path, "paths." + path + "." + method, node, item};
      const auto key = key_parameter(d, op);
      if (key.IsDefined() || (options.all_posts && op.method == "POST")) write_route(d, op, key, names, routes);
    }
  }
  const auto body = routes.out.str();
  if (body.empty()) {
    l.put(0, "# No operation declares an idempotency-key header parameter" +
                 std::string(options.all_posts ? " and there is no POST." : "; --all-posts proposes every POST."));
    l.put(0, "routes: []");
  } else {
    l.put(0, "routes:");
    l.out << body;
  }
  return l.out.str();
}

std::string propose_routes(const std::string& path, const OpenApiOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, 0, "", "cannot read the OpenAPI document");
  std::ostringstream text;
  text << in.rdbuf();
  return propose_routes_text(text.str(), path, options);
}

}  // namespace idem::settings
