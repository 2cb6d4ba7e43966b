// http_server.h: the small HTTP/1.x server behind the Prometheus endpoint.
//
// 1. One owned thread ("mkd-metrics") serves every connection through poll(): a scrape never
//    waits for another one, so any number of concurrent scrapes are served, each as soon as
//    its request has arrived.
// 2. A connection gets one request and one response, then it is closed (`Connection: close`).
//    Nothing waits on a client: reads and writes are non-blocking, and a connection that has not
//    sent a whole request within `idle_timeout`, or not taken the whole response within it, is
//    closed. So idle or slow connections cost a descriptor each for a bounded time and block
//    nothing.
// 3. At most `max_connections` at once; a connection beyond it is closed as soon as it is
//    accepted. Requests larger than `max_request_bytes` get 431 and are closed.
// 4. Running out of descriptors (EMFILE, ENFILE) is survived like the client socket does
//    (spare_fd.h): a waiting connection is answered 503 and closed, the event is counted and
//    reported to `on_out_of_descriptors` (without one, logged at most once a second), and
//    accepting rests for a moment.
// 5. GET (and HEAD) of `path` is answered by the handler; other paths 404, other methods 405.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "mkernel/common/status.h"
#include "mkernel/protocol/session_wire.h"

namespace mkernel::daemon {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:9464";  // host:port; IPv6 hosts in brackets; port 0 = any
  std::string path = "/metrics";
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  size_t max_connections = 64;
  std::chrono::milliseconds idle_timeout{5000};
  size_t max_request_bytes = 8192;
  // Note 4: called on the server's thread for each accept that found no descriptor; it must
  // not wait.
  std::function<void(const Status& why)> on_out_of_descriptors;
};

class HttpServer {
 public:
  // `body` builds the response to each GET of the path; it runs on the server's thread.
  static StatusOr<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options,
                                                     std::function<std::string()> body);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Connections closed because they stayed idle too long, refused over max_connections, and
  // accepts that found no descriptor (for tests and the log).
  uint64_t idle_closed() const { return idle_closed_.load(); }
  uint64_t over_limit() const { return over_limit_.load(); }
  uint64_t out_of_descriptors() const { return out_of_descriptors_.load(); }
  // Stops serving and joins the thread; open connections are closed. Idempotent.
  void stop();

 private:
  HttpServer(HttpServerOptions options, std::function<std::string()> body);
  void run();

  HttpServerOptions options_;
  std::function<std::string()> body_;
  protocol::UniqueFd listen_fd_;
  protocol::UniqueFd wake_fd_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> idle_closed_{0};
  std::atomic<uint64_t> over_limit_{0};
  std::atomic<uint64_t> out_of_descriptors_{0};
};

}  // namespace mkernel::daemon
