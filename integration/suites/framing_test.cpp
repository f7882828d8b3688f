// Request framing and limits at the edge: ambiguous framing is refused before anything is
// forwarded (request smuggling), and every limit answers its contract code.
#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {

struct Edge {
  Edge() {
    auto o = options_for(backend);
    o.max_header_bytes = "4KiB";
    o.max_request_body = "64KiB";
    sidecar = std::make_unique<Sidecar>(o);
  }
  TestBackend backend;
  std::unique_ptr<Sidecar> sidecar;
  std::string tenant = unique("tenant");
};

std::string head(const std::string& path, const std::string& tenant, const std::string& extra) {
  return "POST " + path + " HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
         "X-Tenant-Id: " + tenant + "\r\nIdempotency-Key: " + unique("k") + "\r\n" + extra;
}

}  // namespace

TEST_CASE("Content-Length together with Transfer-Encoding is refused in either order") {
  Edge e;
  const std::string body = "5\r\n{\"a\"}\r\n0\r\n\r\n";
  for (const std::string path : {"/orders", "/unmatched"}) {
    const std::vector<std::string> requests = {
        head(path, e.tenant, "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n") + body,
        head(path, e.tenant, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n") + body,
        head(path, e.tenant, "Content-Length: 5\r\nContent-Length: 5\r\n\r\n{\"a\"}"),
    };
    for (const auto& raw : requests) {
      auto res = parse_response(raw_exchange(e.sidecar->port(), raw));
      CHECK(res.status == 400);
      CHECK(problem_code(res) == "bad_request");
      CHECK_FALSE(res.keep_alive);
    }
  }
  CHECK(e.backend.calls().empty());
  Db db(database_url());
  CHECK(count_rows(db, e.tenant) == 0);
}

TEST_CASE("a body over max_request_body answers 413, headers over max_header_bytes 431") {
  Edge e;
  HttpClient client(e.sidecar->port());
  auto big = client.post("/orders", "[" + std::string(70 * 1024, '1') + "]",
                         order_headers(e.tenant, unique("k")));
  CHECK(big.status == 413);
  CHECK(problem_code(big) == "request_too_large");

  auto chunked = parse_response(raw_exchange(
      e.sidecar->port(), head("/orders", e.tenant, "Transfer-Encoding: chunked\r\n\r\n") +
                             "11800\r\n" + std::string(0x11800, 'x') + "\r\n0\r\n\r\n"));
  CHECK(chunked.status == 413);

  HttpClient other(e.sidecar->port());
  auto headers = order_headers(e.tenant, unique("k"), {{"X-Padding", std::string(5000, 'p')}});
  auto huge = other.post("/orders", "{}", headers);
  CHECK(huge.status == 431);
  CHECK(problem_code(huge) == "headers_too_large");

  CHECK(e.backend.calls().empty());
  Db db(database_url());
  CHECK(count_rows(db, e.tenant) == 0);
}
