// Logging: json_escape, and the exact shape of JSON and text lines captured through an
// ostream sink. Boost.JSON (compiled header-only into this test only) checks that every JSON
// line is a valid object with typed fields.
#include <doctest/doctest.h>

#include <boost/json/src.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "observability/logging.hpp"

using namespace idem;
using namespace idem::obs;
namespace json = boost::json;

namespace {

// Points the loggers at a string for the life of a test, then back at stderr, so no logger
// outlives the stream it writes into.
class Capture {
 public:
  explicit Capture(settings::LogFormat format, settings::LogLevel level = settings::LogLevel::info)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    setup_logging(settings::LogSettings{level, format}, sink_);
  }
  ~Capture() { setup_logging(settings::LogSettings{}); }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  const std::shared_ptr<spdlog::sinks::ostream_sink_mt>& sink() const { return sink_; }
  std::string text() const { return out_.str(); }
  void clear() { out_.str(""); }
  std::vector<std::string> lines() const {
    std::vector<std::string> result;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) result.push_back(line);
    REQUIRE_MESSAGE((out_.str().empty() || out_.str().back() == '\n'), "every line ends with a newline");
    return result;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

const std::regex kTimestamp(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)");

json::object parse_line(const std::string& line) {
  json::error_code ec;
  auto v = json::parse(line, ec);
  REQUIRE_MESSAGE(!ec, "not JSON: " << line);
  REQUIRE_MESSAGE(v.is_object(), "not an object: " << line);
  return v.as_object();
}

AccessRecord sample_record() {
  AccessRecord r;
  r.route = "create-order";
  r.method = "POST";
  r.path = "/orders";
  r.outcome = "created";
  r.status = 201;
  r.duration_ms = 12.3456;
  r.upstream_ms = 10.5;
  r.store_ms = 1.25;
  r.attempt = 2;
  r.key_hash = "3f9a1c2b";
  r.code = "";
  return r;
}

}  // namespace

TEST_CASE("json_escape") {
  CHECK(json_escape("") == "");
  CHECK(json_escape("plain text / ok") == "plain text / ok");
  CHECK(json_escape("say \"hi\"\\") == "say \\\"hi\\\"\\\\");
  CHECK(json_escape("a\nb\rc\td\be\ff") == "a\\nb\\rc\\td\\be\\ff");
  CHECK(json_escape(std::string("\x00\x01\x1f\x7f", 4)) == "\\u0000\\u0001\\u001f\\u007f");
  // Valid UTF-8 passes through: 2, 3 and 4 byte sequences.
  CHECK(json_escape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(json_escape("\xf4\x8f\xbf\xbf") == "\xf4\x8f\xbf\xbf");  // U+10FFFF
  // Line and paragraph separators are escaped.
  CHECK(json_escape("a\xe2\x80\xa8" "b\xe2\x80\xa9") == "a\\u2028b\\u2029");
  const std::string fffd = "\xef\xbf\xbd";
  CHECK(json_escape("\x80") == fffd);                                  // lone continuation byte
  CHECK(json_escape("a\xe2\x82" "b") == "a" + fffd + "b");             // truncated: one replacement
  CHECK(json_escape("\xe2\x82") == fffd);                              // truncated at the end
  CHECK(json_escape("\xc0\xaf") == fffd + fffd);                       // overlong '/'
  CHECK(json_escape("\xe0\x80\xaf") == fffd + fffd + fffd);            // overlong, 3 bytes
  CHECK(json_escape("\xed\xa0\x80") == fffd + fffd + fffd);            // UTF-16 surrogate
  CHECK(json_escape("\xf4\x90\x80\x80") == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(json_escape("\xf5\xff") == fffd + fffd);
  // Whatever the input, the output embeds in a JSON string.
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  CHECK(json::parse("\"" + json_escape(all) + "\"").is_string());
}

TEST_CASE("json lines: ts, level, msg") {
  Capture capture(settings::LogFormat::json);
  spdlog::info("listening on {}", "127.0.0.1:8080");
  spdlog::warn("tricky \"quote\" \\ and\nnewline \x01");
  spdlog::debug("hidden at info level");
  const auto lines = capture.lines();
  REQUIRE(lines.size() == 2);
  const auto first = parse_line(lines[0]);
  CHECK(first.size() == 3);
  CHECK(std::regex_match(std::string(first.at("ts").as_string()), kTimestamp));
  CHECK(first.at("level") == "info");
  CHECK(first.at("msg") == "listening on 127.0.0.1:8080");
  CHECK(lines[0].rfind("{\"ts\":\"", 0) == 0);
  const auto second = parse_line(lines[1]);
  CHECK(second.at("level") == "warn");
  CHECK(second.at("msg") == "tricky \"quote\" \\ and\nnewline \x01");
}

TEST_CASE("json access lines carry the record as typed fields") {
  Capture capture(settings::LogFormat::json);
  log_access(sample_record());
  AccessRecord minimal;
  minimal.route = "unmatched";
  minimal.method = "GET";
  minimal.path = "/health\"\n";
  minimal.outcome = "passthrough";
  minimal.status = 200;
  minimal.duration_ms = 0.5;
  minimal.code = "";
  log_access(minimal);
  const auto lines = capture.lines();
  REQUIRE(lines.size() == 2);

  const auto a = parse_line(lines[0]);
  CHECK(a.at("type") == "access");
  CHECK(a.at("level") == "info");
  CHECK(std::regex_match(std::string(a.at("ts").as_string()), kTimestamp));
  CHECK(a.at("route") == "create-order");
  CHECK(a.at("method") == "POST");
  CHECK(a.at("path") == "/orders");
  CHECK(a.at("outcome") == "created");
  CHECK(a.at("status").is_int64());
  CHECK(a.at("status") == 201);
  CHECK(a.at("duration_ms").is_double());
  CHECK(a.at("duration_ms").as_double() == doctest::Approx(12.346));
  CHECK(a.at("upstream_ms").as_double() == doctest::Approx(10.5));
  CHECK(a.at("store_ms").as_double() == doctest::Approx(1.25));
  CHECK(a.at("attempt") == 2);
  CHECK(a.at("key_hash") == "3f9a1c2b");
  CHECK_FALSE(a.contains("code"));  // empty: left out
  CHECK_FALSE(a.contains("msg"));
  // Nothing but the record's fields plus ts, level and type.
  CHECK(a.size() == 3 + 10);

  const auto b = parse_line(lines[1]);
  CHECK(b.at("path") == "/health\"\n");
  CHECK_FALSE(b.contains("upstream_ms"));
  CHECK_FALSE(b.contains("store_ms"));
  CHECK_FALSE(b.contains("attempt"));
  CHECK_FALSE(b.contains("key_hash"));
  CHECK(b.size() == 3 + 6);
}

TEST_CASE("text lines") {
  Capture capture(settings::LogFormat::text);
  spdlog::error("upstream refused\nforged line");
  auto record = sample_record();
  record.code = "upstream_unavailable";
  record.path = "/orders with space";
  log_access(record);
  const auto lines = capture.lines();
  REQUIRE(lines.size() == 2);  // the newline inside the message did not start a line
  const std::regex plain(R"((\S+) error upstream refused\\nforged line)");
  std::smatch m;
  REQUIRE(std::regex_match(lines[0], m, plain));
  CHECK(std::regex_match(m[1].str(), kTimestamp));
  CHECK(lines[1].substr(24) ==
        " info  access route=create-order method=POST path=\"/orders with space\" outcome=created status=201 "
        "duration_ms=12.346 upstream_ms=10.500 store_ms=1.250 attempt=2 key_hash=3f9a1c2b "
        "code=upstream_unavailable");
}

TEST_CASE("the level filters lines, access lines included; reload switches format in place") {
  Capture capture(settings::LogFormat::json, settings::LogLevel::warn);
  spdlog::info("dropped");
  log_access(sample_record());
  spdlog::warn("kept");
  CHECK(capture.text().find("dropped") == std::string::npos);
  CHECK(capture.text().find("access") == std::string::npos);
  CHECK(capture.text().find("\"msg\":\"kept\"") != std::string::npos);

  // A reload with the same sink keeps the logger objects and changes format and level.
  auto* before = spdlog::default_logger_raw();
  setup_logging({settings::LogLevel::debug, settings::LogFormat::text}, capture.sink());
  CHECK(spdlog::default_logger_raw() == before);
  capture.clear();
  spdlog::debug("now visible");
  log_access(sample_record());
  const auto text = capture.text();
  CHECK(text.find(" debug now visible\n") != std::string::npos);
  CHECK(text.find(" info  access route=create-order ") != std::string::npos);
  CHECK(text.find('{') == std::string::npos);
}

TEST_CASE("loggers initialized through spdlog get the format and their name") {
  Capture capture(settings::LogFormat::json);
  auto pg = std::make_shared<spdlog::logger>("pg", spdlog::default_logger()->sinks().begin(),
                                             spdlog::default_logger()->sinks().end());
  spdlog::initialize_logger(pg);
  pg->info("connected");
  spdlog::drop("pg");
  const auto lines = capture.lines();
  REQUIRE(lines.size() == 1);
  const auto o = parse_line(lines[0]);
  CHECK(o.at("logger") == "pg");
  CHECK(o.at("msg") == "connected");
}

TEST_CASE("a reload that switches format while requests log never mixes formats in a line") {
  Capture capture(settings::LogFormat::json);
  constexpr int kThreads = 4;
  constexpr int kLines = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kLines; ++i) log_access(sample_record());
    });
  }
  for (int i = 0; i < 200; ++i) {
    setup_logging({settings::LogLevel::info, i % 2 ? settings::LogFormat::json : settings::LogFormat::text},
                  capture.sink());
  }
  for (auto& th : threads) th.join();
  const auto lines = capture.lines();
  CHECK(lines.size() == kThreads * kLines);
  for (const auto& line : lines) {
    if (line.front() == '{') {
      const auto o = parse_line(line);
      CHECK(o.at("type") == "access");
      CHECK(o.at("status") == 201);
    } else {
      CHECK(line.find(" info  access route=create-order method=POST path=/orders outcome=created status=201 ") ==
            24);
    }
  }
}
