#pragma once
// Prometheus text exposition (format 0.0.4) of the server's counters, gauges and histograms.
#include <cstdint>
#include <string>
#include <vector>

namespace flashlite::engine::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {}
  void observe(double value);
  // Appends `name`'s HELP, TYPE, cumulative _bucket lines (le="+Inf" last), _sum and _count.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Appends one counter or gauge sample with its HELP and TYPE lines.
void render_metric(std::string& out, const std::string& name, const char* type, const std::string& help, double value);

}  // namespace flashlite::engine::server
