#include "http_server.h"

#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include <spdlog/spdlog.h>

#include "spare_fd.h"

namespace mkernel::daemon {

using Clock = std::chrono::steady_clock;
namespace mp = mkernel::protocol;

namespace {

struct Connection {
  mp::UniqueFd fd;
  Clock::time_point deadline;  // note 2
  std::string in;              // the request so far
  std::string out;             // the response, once the request is whole
  size_t sent = 0;
  bool writing = false;
};

std::string response(int code, const char* reason, const std::string& content_type, const std::string& body,
                     bool head) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + content_type +
                   "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

// "host:port" with the host possibly in brackets.
bool split_host_port(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) return false;
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return !host->empty() && std::all_of(port->begin(), port->end(), ::isdigit);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, std::function<std::string()> body)
    : options_(std::move(options)), body_(std::move(body)) {}

HttpServer::~HttpServer() { stop(); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options,
                                                        std::function<std::string()> body) {
  std::string host, port;
  if (!split_host_port(options.listen, &host, &port))
    return Status(StatusCode::kInvalidArgument, "metrics listen: '" + options.listen + "'; expected host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return Status(StatusCode::kInvalidArgument,
                  "metrics listen: '" + options.listen + "': " + ::gai_strerror(rc) + "; expected host:port");
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(body)));
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    mp::UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 64) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    server->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    server->listen_fd_ = std::move(fd);
    break;
  }
  ::freeaddrinfo(found);
  if (!server->listen_fd_.valid())
    return Status(StatusCode::kUnavailable, "metrics: cannot listen on " + options.listen + ": " + last_error);
  server->wake_fd_ = mp::UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!server->wake_fd_.valid()) return errno_status("eventfd", errno);
  HttpServer* raw = server.get();
  server->thread_ = std::thread([raw] { raw->run(); });
  pthread_setname_np(server->thread_.native_handle(), "mkd-metrics");
  return server;
}

void HttpServer::stop() {
  stop_.store(true);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  listen_fd_.reset();
}

void HttpServer::run() {
  std::list<Connection> conns;
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> polled;
  SpareDescriptor spare;
  Clock::time_point accept_resume{}, last_exhaustion_log{};
  while (!stop_.load()) {
    const auto now = Clock::now();
    fds.clear();
    polled.clear();
    fds.push_back({now >= accept_resume ? listen_fd_.get() : -1, POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd.get(), static_cast<short>(it->writing ? POLLOUT : POLLIN), 0});
      polled.push_back(it);
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stop_.load()) break;
    for (size_t i = 0; i < polled.size(); ++i) {
      Connection& c = *polled[i];
      const short re = fds[i + 2].revents;
      bool done = false;
      if (!c.writing && (re & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          done = true;
        } else if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          const size_t end = c.in.find("\r\n\r\n");
          if (end == std::string::npos && c.in.find("\n\n") == std::string::npos) {
            if (c.in.size() > options_.max_request_bytes) {
              c.out = response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false);
              c.writing = true;
            }
          } else {
            // Note 5: "GET /metrics HTTP/1.1"; a query string is ignored.
            const std::string line = c.in.substr(0, c.in.find_first_of("\r\n"));
            const size_t sp1 = line.find(' ');
            const size_t sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
            const std::string method = line.substr(0, sp1);
            std::string target = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
            target = target.substr(0, target.find('?'));
            const bool head = method == "HEAD";
            if (method != "GET" && !head)
              c.out = response(405, "Method Not Allowed", "text/plain", "only GET\n", false);
            else if (target != options_.path)
              c.out = response(404, "Not Found", "text/plain", "try " + options_.path + "\n", head);
            else
              c.out = response(200, "OK", options_.content_type, body_(), head);
            c.writing = true;
          }
        }
      }
      if (c.writing && !done) {
        while (c.sent < c.out.size()) {
          const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n > 0) {
            c.sent += static_cast<size_t>(n);
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
          done = true;
          break;
        }
        if (c.sent == c.out.size()) done = true;
      }
      if (!done && Clock::now() > c.deadline) {
        done = true;
        idle_closed_.fetch_add(1);
      }
      if (done) conns.erase(polled[i]);
    }
    if (fds[0].revents & POLLIN) {
      for (int k = 0; k < 16; ++k) {
        mp::UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd.valid()) {
          const int e = errno;
          if (is_descriptor_exhaustion(e)) {
            // Note 4. The shortage is counted and reported before the 503 goes out, so whoever
            // reads the answer also sees the report.
            out_of_descriptors_.fetch_add(1);
            accept_resume = Clock::now() + std::chrono::milliseconds(100);
            if (options_.on_out_of_descriptors) {
              options_.on_out_of_descriptors(
                  Status(StatusCode::kResourceExhausted, std::string("metrics: no descriptor to accept a scrape (") +
                                                             std::strerror(e) + "); it was answered 503 and closed"));
            } else if (Clock::now() - last_exhaustion_log >= std::chrono::seconds(1)) {
              last_exhaustion_log = Clock::now();
              spdlog::warn("metrics: no descriptor to accept a scrape ({}); {} so far", std::strerror(e),
                           out_of_descriptors_.load());
            }
            spare.shed_one(listen_fd_.get(),
                           response(503, "Service Unavailable", "text/plain", "out of descriptors\n", false));
          }
          break;
        }
        if (conns.size() >= options_.max_connections) {
          over_limit_.fetch_add(1);
          continue;  // closed at once (note 3)
        }
        conns.push_back(Connection{std::move(fd), Clock::now() + options_.idle_timeout, {}, {}, 0, false});
      }
    }
  }
}

}  // namespace mkernel::daemon
