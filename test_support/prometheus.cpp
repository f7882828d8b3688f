#include "test_support/prometheus.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <set>

#include "test_support/wait.hpp"

namespace idem::test {

namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

// A metric name (':' allowed) or a label name (no ':') at line[i]; "" when there is none.
std::string read_name(std::string_view line, std::size_t& i, bool metric) {
  const auto start = i;
  if (i >= line.size() || !is_name_start(line[i]) || (!metric && line[i] == ':')) return {};
  while (i < line.size() && is_name_char(line[i]) && (metric || line[i] != ':')) ++i;
  return std::string(line.substr(start, i - start));
}

std::optional<double> parse_value(const std::string& text) {
  if (text == "+Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  if (text == "NaN") return NAN;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

// The family a sample belongs to: its own name, or for histograms name_bucket, name_sum
// and name_count; "" when none was declared.
std::string family_of(const std::string& sample, const std::map<std::string, std::string>& types) {
  if (types.count(sample)) return sample;
  for (const std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (sample.size() > suffix.size() && sample.ends_with(suffix)) {
      const auto base = sample.substr(0, sample.size() - suffix.size());
      const auto t = types.find(base);
      if (t != types.end() && t->second == "histogram") return base;
    }
  }
  return {};
}

std::string describe(const std::string& name, const Labels& labels) {
  std::string out = name + "{";
  for (const auto& [k, v] : labels) out += k + "=\"" + v + "\",";
  return out + "}";
}

class Parser {
 public:
  Exposition parse(std::string_view text) {
    if (text.empty() || text.back() != '\n') fail("the exposition does not end with a newline");
    while (!text.empty()) {
      const auto nl = text.find('\n');
      line_ = text.substr(0, nl);
      text.remove_prefix(nl + 1);
      ++line_no_;
      if (line_.empty()) bad("an empty line");
      if (line_.front() == '#') {
        comment();
      } else {
        sample();
      }
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("exposition line " + std::to_string(line_no_) + " '" + std::string(line_) + "': " + what);
  }

  void comment() {
    if (!line_.starts_with("# HELP ") && !line_.starts_with("# TYPE ")) bad("unknown comment");
    const bool type = line_.starts_with("# TYPE ");
    std::size_t i = 7;
    const auto name = read_name(line_, i, true);
    if (name.empty()) bad("no metric name");
    if (i >= line_.size() || line_[i] != ' ') bad("no space after the name");
    const std::string rest(line_.substr(i + 1));
    if (type) {
      if (rest != "counter" && rest != "gauge" && rest != "histogram") bad("unknown type");
      if (out_.types.count(name)) bad("TYPE twice for " + name);
      if (families_seen_.count(name)) bad("TYPE after samples of " + name);
      out_.types[name] = rest;
      current_ = name;
    } else {
      if (out_.help.count(name)) bad("HELP twice for " + name);
      out_.help[name] = rest;
    }
  }

  void sample() {
    Sample s;
    std::size_t i = 0;
    s.name = read_name(line_, i, true);
    if (s.name.empty()) bad("no metric name");
    if (i < line_.size() && line_[i] == '{') labels(i, s.labels);
    if (i >= line_.size() || line_[i] != ' ') bad("no space before the value");
    const auto value = parse_value(std::string(line_.substr(i + 1)));
    if (!value) bad("bad value");
    s.value = *value;
    const auto family = family_of(s.name, out_.types);
    if (family.empty()) bad("sample before its TYPE line: " + s.name);
    if (family != current_) bad("samples of " + family + " are not grouped under its TYPE");
    if (!out_.help.count(family)) bad("no HELP for " + family);
    if (!series_.insert(describe(s.name, s.labels)).second) bad("duplicate series");
    families_seen_.insert(family);
    out_.samples.push_back(std::move(s));
  }

  // `{label="value",...}` from line_[i] == '{' to just past the '}'.
  void labels(std::size_t& i, Labels& out) {
    ++i;
    for (;;) {
      if (i >= line_.size()) bad("unterminated label set");
      if (line_[i] == '}') {
        ++i;
        return;
      }
      const auto label = read_name(line_, i, false);
      if (label.empty() || line_.substr(i, 2) != "=\"") bad("malformed label");
      i += 2;
      std::string value;
      for (;;) {
        if (i >= line_.size()) bad("unterminated label value");
        const char c = line_[i++];
        if (c == '"') break;
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i >= line_.size()) bad("dangling escape");
        const char e = line_[i++];
        if (e != '\\' && e != '"' && e != 'n') bad("unknown escape");
        value += e == 'n' ? '\n' : e;
      }
      if (!out.emplace(label, value).second) bad("label twice: " + label);
      if (i < line_.size() && line_[i] == ',') ++i;
    }
  }

  Exposition out_;
  std::string_view line_;
  std::size_t line_no_ = 0;
  std::string current_;                // family of the last TYPE line
  std::set<std::string> families_seen_;  // families whose samples started
  std::set<std::string> series_;
};

}  // namespace

std::optional<double> Exposition::find(std::string_view name, const Labels& labels) const {
  for (const auto& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

double Exposition::value(std::string_view name, const Labels& labels) const {
  const auto v = find(name, labels);
  if (!v) fail("no sample " + describe(std::string(name), labels) + " in the scrape");
  return *v;
}

double Exposition::get(std::string_view name, const Labels& labels) const {
  return find(name, labels).value_or(NAN);
}

double Exposition::sum(std::string_view name, const Labels& subset) const {
  double total = 0;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : subset) {
      auto it = s.labels.find(k);
      match = match && it != s.labels.end() && it->second == v;
    }
    if (match) total += s.value;
  }
  return total;
}

Exposition parse_exposition(std::string_view text) { return Parser().parse(text); }

void check_histograms(const Exposition& e) {
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    std::map<Labels, std::vector<std::pair<double, double>>> series;
    for (const auto& s : e.samples) {
      if (s.name != family + "_bucket") continue;
      auto labels = s.labels;
      REQUIRE(labels.count("le") == 1);
      const auto le = parse_value(labels["le"]);
      REQUIRE_MESSAGE(le.has_value(), "bad le '" << labels["le"] << "'");
      labels.erase("le");
      series[labels].emplace_back(*le, s.value);
    }
    for (const auto& [labels, buckets] : series) {
      INFO(family);
      REQUIRE_FALSE(buckets.empty());
      for (std::size_t i = 1; i < buckets.size(); ++i) {
        CHECK(buckets[i].first > buckets[i - 1].first);    // le ascending
        CHECK(buckets[i].second >= buckets[i - 1].second);  // cumulative
      }
      CHECK(std::isinf(buckets.back().first));
      CHECK(e.get(family + "_count", labels) == buckets.back().second);
      CHECK_FALSE(std::isnan(e.get(family + "_sum", labels)));
    }
  }
}

}  // namespace idem::test
