#pragma once
// The Prometheus text exposition format (0.0.4), parsed back strictly by a small parser
// that shares nothing with the sidecar's renderer: the metrics unit tests and the
// end-to-end scrapes both check the syntax line by line before they compare values.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::test {

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family name -> counter | gauge | histogram
  std::map<std::string, std::string> help;   // family name -> help text
  std::vector<Sample> samples;               // in order

  // The sample with exactly these labels, or nullopt.
  std::optional<double> find(std::string_view name, const Labels& labels = {}) const;
  // Like find(), failing the test when the sample is missing.
  double value(std::string_view name, const Labels& labels = {}) const;
  // Like find(), NaN when the sample is missing (compares unequal to every number).
  double get(std::string_view name, const Labels& labels = {}) const;
  // Sum over every sample of `name` whose labels include `subset`.
  double sum(std::string_view name, const Labels& subset = {}) const;
  bool has_family(std::string_view name) const { return types.count(std::string(name)) != 0; }
};

// Parses the text format strictly and fails the test (Failure, wait.hpp) on anything
// else: every line a sample `name{label="value",...} value` or a `# HELP` / `# TYPE`
// comment, no empty line, a final newline; label names without ':', escapes \\ \" \n
// only; each family with one TYPE (counter, gauge or histogram) and one HELP, its TYPE
// before its samples and its samples together; histogram samples as _bucket, _sum and
// _count of a histogram family; no series twice.
Exposition parse_exposition(std::string_view text);

// Checks every histogram series (doctest CHECKs): le ascending, buckets cumulative, the
// last bucket +Inf and equal to _count, a _sum present.
void check_histograms(const Exposition& e);

}  // namespace idem::test
