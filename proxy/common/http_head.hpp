#pragma once
// Writing a message head by hand: the server and the upstream client each build their
// start line and share this for the fields, byte for byte what Beast's serializer writes,
// without walking its buffer sequence.
#include <string>

#include <boost/beast/http/fields.hpp>

namespace idem::http_head {

inline void append_fields(std::string& out, const boost::beast::http::fields& fields) {
  for (const auto& f : fields) {
    const auto name = f.name_string();
    const auto value = f.value();
    out.append(name.data(), name.size());
    out += ": ";
    out.append(value.data(), value.size());
    out += "\r\n";
  }
  out += "\r\n";
}

}  // namespace idem::http_head
