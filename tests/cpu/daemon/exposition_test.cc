// exposition_test.cc: the metrics text format (metrics_text.h) held to a strict checker and to
// promtool where it is installed, and the HTTP server behind it (http_server.h): concurrent
// scrapes beside idle connections, idle connections closed, the connection cap, running out of
// descriptors.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "exposition_check.h"
#include "http_server.h"
#include "metrics.h"
#include "metrics_text.h"
#include "ops_fake_control.h"

namespace mkernel::daemon {
namespace {

using namespace std::chrono_literals;
using testing::check_exposition;
using testing::Exhaustion;
using testing::FakeControl;
using testing::promtool_check;

int connect_local(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET path over HTTP/1.1 (the server closes when done); "" on failure.
std::string get(int port, const std::string& path = "/metrics", std::chrono::seconds bound = 5s) {
  const int fd = connect_local(port);
  if (fd < 0) return "";
  timeval tv{static_cast<time_t>(bound.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string out;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[8192];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string body_of(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

TEST(MetricText, SpecialValuesAreSpelledAsTheFormatWants) {
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_metric_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_metric_value(0), "0");
  EXPECT_EQ(format_metric_value(123456789), "123456789");
  EXPECT_EQ(format_metric_value(1.024e-06), "1.024e-06");
  EXPECT_EQ(format_metric_value(0.1), "0.1");
  EXPECT_EQ(format_metric_value(1e300), "1e+300");
  for (const double v : {0.1, 1.0 / 3, 2.5e-9, 12345.678, 1e-300}) {
    EXPECT_EQ(std::strtod(format_metric_value(v).c_str(), nullptr), v) << format_metric_value(v);
  }
}

TEST(MetricText, StrictCheckerAndPromtoolAcceptTheOutputNaNIncluded) {
  std::vector<MetricFamily> fs;
  MetricFamily g{"mk_test_level", "A gauge with \\ and\na newline in its help", MetricType::kGauge, {}};
  g.samples.push_back({"", {{"label", "quote \" backslash \\ newline \n"}}, std::numeric_limits<double>::quiet_NaN()});
  g.samples.push_back({"", {{"label", "inf"}}, std::numeric_limits<double>::infinity()});
  g.samples.push_back({"", {{"label", "neg"}}, -std::numeric_limits<double>::infinity()});
  fs.push_back(g);
  MetricFamily c{"mk_test_total", "A counter", MetricType::kCounter, {}};
  c.samples.push_back({"", {}, 42});
  fs.push_back(c);
  MetricFamily h{"mk_test_seconds", "A histogram", MetricType::kHistogram, {}};
  h.samples.push_back({"_bucket", {{"le", "0.5"}}, 1});
  h.samples.push_back({"_bucket", {{"le", "+Inf"}}, 3});
  h.samples.push_back({"_sum", {}, std::numeric_limits<double>::quiet_NaN()});
  h.samples.push_back({"_count", {}, 3});
  fs.push_back(h);
  const std::string text = to_text(fs);
  EXPECT_NE(text.find("mk_test_level{label=\"quote \\\" backslash \\\\ newline \\n\"} NaN\n"), std::string::npos)
      << text;
  EXPECT_EQ(check_exposition(text), "") << text;
  const auto [ran, out] = promtool_check(text);
  if (ran) {
    EXPECT_NE(out.find("exit=0"), std::string::npos) << out << text;
  }
  // The checker is not a rubber stamp: what older exporters wrote is refused.
  EXPECT_NE(check_exposition("# TYPE x summary\nx{quantile=\"0.5\"} Nan\n"), "");
  EXPECT_NE(check_exposition("x{a=\"1\",a=\"2\"} 1\n"), "");
  EXPECT_NE(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n"), "");
  EXPECT_NE(check_exposition("# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n"), "");
}

TEST(MetricText, TheDaemonsWholeScrapePassesBoth) {
  FakeControl control;
  control.set_refusals("malformed", 7);
  const std::string text = to_text(collect_metrics(control));
  EXPECT_EQ(check_exposition(text), "") << text;
  EXPECT_NE(text.find("mkerneld_refusals_total{reason=\"malformed\"} 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mkerneld_client_descriptors 5\n"), std::string::npos) << text;
  const auto [ran, out] = promtool_check(text);
  if (!ran) GTEST_SKIP() << "promtool not installed (Debian package \"prometheus\"): the strict checker ran alone";
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(HttpServerOptions o) {
    o.listen = "127.0.0.1:0";
    auto s = HttpServer::start(o, [this] {
      ++scrapes_;
      return std::string("x 1\n");
    });
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    server_ = std::move(s).value();
  }
  std::atomic<int> scrapes_{0};
  std::unique_ptr<HttpServer> server_;
};

// Two idle connections used to hold every scrape for 30 s; now they hold nothing, and any
// number of scrapes proceed at once.
TEST_F(HttpServerTest, ConcurrentScrapesBesideIdleConnections) {
  start({});
  const int idle1 = connect_local(server_->port()), idle2 = connect_local(server_->port());
  ASSERT_GE(idle1, 0);
  ASSERT_GE(idle2, 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> scrapers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    scrapers.emplace_back([&] {
      const std::string r = get(server_->port());
      if (r.rfind("HTTP/1.1 200 OK", 0) == 0 && body_of(r) == "x 1\n") ++ok;
    });
  for (auto& t : scrapers) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_NE(get(server_->port(), "/other").find("404"), std::string::npos);
  ::close(idle1);
  ::close(idle2);
}

TEST_F(HttpServerTest, IdleConnectionsAreClosedAfterTheBound) {
  HttpServerOptions o;
  o.idle_timeout = 300ms;
  start(o);
  const int idle = connect_local(server_->port());
  ASSERT_GE(idle, 0);
  ::send(idle, "GET /met", 8, MSG_NOSIGNAL);  // half a request, then nothing
  timeval tv{3, 0};
  ::setsockopt(idle, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  EXPECT_EQ(::recv(idle, &c, 1, 0), 0) << "closed by the server";
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 1500ms);
  EXPECT_EQ(server_->idle_closed(), 1u);
  ::close(idle);
}

TEST_F(HttpServerTest, ConnectionsOverTheCapAreClosedAndScrapesGoOn) {
  HttpServerOptions o;
  o.max_connections = 2;
  start(o);
  std::vector<int> held;
  for (int i = 0; i < 2; ++i) held.push_back(connect_local(server_->port()));
  std::this_thread::sleep_for(100ms);
  const int extra = connect_local(server_->port());
  timeval tv{2, 0};
  ::setsockopt(extra, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  EXPECT_EQ(::recv(extra, &c, 1, 0), 0) << "closed at once";
  ::close(extra);
  for (int fd : held) ::close(fd);
  std::this_thread::sleep_for(100ms);
  EXPECT_NE(get(server_->port()).find("200 OK"), std::string::npos);
  EXPECT_GE(server_->over_limit(), 1u);
}

// Out of descriptors: a scrape that arrives meanwhile is answered 503 and closed at once (not
// left in the backlog), and the daemon is told (refusal out_of_descriptors); once descriptors are
// free, scrapes are served again.
TEST(MetricsExporterDescriptors, AScrapeWithoutADescriptorIsAnsweredAndScrapesResume) {
  FakeControl control;
  MetricsOptions opt;
  opt.listen = "127.0.0.1:0";
  auto exporter = MetricsExporter::start(control, opt);
  ASSERT_TRUE(exporter.ok()) << exporter.status().to_string();
  const int port = exporter.value()->port();
  ASSERT_NE(get(port).find("200 OK"), std::string::npos);

  Exhaustion ex;
  ASSERT_TRUE(ex.fill(1));  // one descriptor left: the scraper's socket takes it
  const int fd = connect_local(port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  // Nothing is sent: the server's answer comes without a request, and closing a connection
  // with nothing unread keeps it a plain close.
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto t0 = std::chrono::steady_clock::now();
  std::string answer;
  char buf[512];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "not left waiting in the backlog";
  ::close(fd);
  ex.release();
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_GE(control.out_of_descriptors(), 1u);
  EXPECT_NE(control.last_shortage().find("metrics: no descriptor to accept a scrape"), std::string::npos)
      << control.last_shortage();

  std::string again;
  const auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t1 < 3s && (again = get(port)).find("200 OK") == std::string::npos)
    std::this_thread::sleep_for(50ms);
  EXPECT_NE(again.find("200 OK"), std::string::npos) << "scrapes are served again: " << again;
  exporter.value()->stop();
}

}  // namespace
}  // namespace mkernel::daemon
