// metrics_test.cc: the Prometheus exporter, scraped over plain HTTP on 127.0.0.1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "latency_histogram.h"
#include "metrics.h"
#include "ops_fake_control.h"

namespace mkernel::daemon {
namespace {

using testing::FakeControl;

// GET /metrics over a plain socket (HTTP/1.0, so the server closes when done); "" on failure.
std::string scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

bool has_line(const std::string& body, const std::string& line) {
  std::istringstream in(body);
  std::string l;
  while (std::getline(in, l)) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l == line) return true;
  }
  return false;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetricsOptions opt;
    opt.listen = "127.0.0.1:0";
    auto exporter = MetricsExporter::start(control_, opt);
    ASSERT_TRUE(exporter.ok()) << exporter.status().to_string();
    exporter_ = std::move(exporter).value();
    ASSERT_GT(exporter_->port(), 0);
  }
  FakeControl control_;
  std::unique_ptr<MetricsExporter> exporter_;
};

TEST_F(MetricsTest, NamesLabelsAndValues) {
  const std::string body = scrape(exporter_->port());
  ASSERT_NE(body.find("200 OK"), std::string::npos) << body.substr(0, 200);
  EXPECT_TRUE(has_line(body, "# TYPE mkerneld_commands_total counter")) << body;
  EXPECT_TRUE(has_line(body, "mkerneld_commands_total{gpu=\"0\",outcome=\"ok\"} 10"));
  EXPECT_TRUE(has_line(body, "mkerneld_commands_total{gpu=\"1\",outcome=\"ok\"} 11"));
  EXPECT_TRUE(has_line(body, "mkerneld_commands_total{gpu=\"1\",outcome=\"error\"} 2"));
  EXPECT_TRUE(has_line(body, "mkerneld_commands_total{gpu=\"1\",outcome=\"rejected\"} 1"));
  EXPECT_TRUE(has_line(body, "mkerneld_commands_consumed_total{gpu=\"0\"} 16"));
  EXPECT_TRUE(has_line(body, "mkerneld_bytes_total{gpu=\"1\"} 8192"));
  EXPECT_TRUE(has_line(body, "mkerneld_errors_total{gpu=\"0\"} 2"));
  EXPECT_TRUE(has_line(body, "# TYPE mkerneld_ring_occupancy gauge"));
  EXPECT_TRUE(has_line(body, "mkerneld_ring_occupancy{gpu=\"0\"} 5"));
  EXPECT_TRUE(has_line(body, "mkerneld_ring_capacity{gpu=\"0\"} 1024"));
  EXPECT_TRUE(has_line(body, "mkerneld_commands_in_flight{gpu=\"0\"} 3"));
  EXPECT_TRUE(has_line(body, "mkerneld_sessions 2"));
  EXPECT_TRUE(has_line(body, "mkerneld_up 1"));
  EXPECT_TRUE(has_line(body, "mkerneld_serving 1"));
  EXPECT_TRUE(has_line(body, "mkerneld_draining 0"));
  EXPECT_TRUE(has_line(body, "mkerneld_proxy_up{gpu=\"1\"} 1"));
  EXPECT_TRUE(has_line(body, "mkerneld_nic_up{nic=\"nic1\"} 1"));
  EXPECT_TRUE(has_line(body, "# TYPE mkerneld_command_latency_seconds histogram"));
  EXPECT_TRUE(has_line(body, "mkerneld_command_latency_seconds_count{gpu=\"0\"} 10"));
  EXPECT_TRUE(has_line(body, "mkerneld_command_latency_seconds_bucket{gpu=\"0\",le=\"+Inf\"} 10"));
  // Bucket 10 ends at 1024 ns: the 6 completions below it are counted there.
  EXPECT_TRUE(has_line(body, "mkerneld_command_latency_seconds_bucket{gpu=\"0\",le=\"1.024e-06\"} 6"))
      << body;

  // Every mkerneld_ sample uses only labels from the fixed sets.
  const std::set<std::string> allowed{"gpu", "nic", "outcome", "le", "reason"};
  const std::regex label_re(R"(([a-z_]+)=")");
  std::istringstream in(body);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("mkerneld_", 0) != 0) continue;
    ++samples;
    const auto brace = line.find('{');
    if (brace == std::string::npos) continue;
    const std::string labels = line.substr(brace, line.find('}') - brace);
    for (std::sregex_iterator it(labels.begin(), labels.end(), label_re), end; it != end; ++it) {
      EXPECT_EQ(allowed.count((*it)[1].str()), 1u) << line;
    }
  }
  EXPECT_GT(samples, 40);
}

TEST_F(MetricsTest, EveryScrapeReadsTheDaemonCountersAfresh) {
  control_.set_ok_commands(0, 123456789);
  ASSERT_TRUE(control_.drain().ok());
  ASSERT_TRUE(control_.stall_proxy(1, std::chrono::seconds(10)).ok());
  const std::string body = scrape(exporter_->port());
  EXPECT_TRUE(has_line(body, "mkerneld_commands_total{gpu=\"0\",outcome=\"ok\"} 123456789"))
      << body;
  EXPECT_TRUE(has_line(body, "mkerneld_draining 1"));
  EXPECT_TRUE(has_line(body, "mkerneld_serving 0"));
  EXPECT_TRUE(has_line(body, "mkerneld_proxy_up{gpu=\"1\"} 0"));
  EXPECT_TRUE(has_line(body, "mkerneld_proxy_up{gpu=\"0\"} 1"));
}

TEST_F(MetricsTest, StopIsIdempotentAndClosesThePort) {
  const int port = exporter_->port();
  exporter_->stop();
  exporter_->stop();
  EXPECT_EQ(scrape(port), "");
}

TEST(MetricsExporterStart, BadAddressesAreErrors) {
  FakeControl control;
  MetricsOptions opt;
  opt.listen = "nonsense";
  auto a = MetricsExporter::start(control, opt);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);

  // A port that is taken.
  opt.listen = "127.0.0.1:0";
  auto first = MetricsExporter::start(control, opt);
  ASSERT_TRUE(first.ok());
  opt.listen = "127.0.0.1:" + std::to_string(first.value()->port());
  auto second = MetricsExporter::start(control, opt);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().to_string();
}

TEST(LatencyHistogram, QuantilesFallInsideTheirBuckets) {
  std::array<uint64_t, kLatencyBuckets> b{};
  EXPECT_LT(latency_quantile_ns(b, 0.5), 0);
  b[10] = 6;  // [512, 1024)
  b[14] = 4;  // [8192, 16384)
  const double p50 = latency_quantile_ns(b, 0.5);
  EXPECT_GE(p50, 512);
  EXPECT_LT(p50, 1024);
  const double p99 = latency_quantile_ns(b, 0.99);
  EXPECT_GE(p99, 8192);
  EXPECT_LE(p99, 16384);
  EXPECT_EQ(latency_count(b), 10u);
}

}  // namespace
}  // namespace mkernel::daemon
