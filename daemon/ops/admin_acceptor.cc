#include "admin_acceptor.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include "spare_fd.h"

namespace mkernel::daemon {

namespace mp = mkernel::protocol;
using Clock = std::chrono::steady_clock;

StatusOr<mp::UniqueFd> AdminAcceptor::listen_unix(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status(StatusCode::kInvalidArgument, "admin socket path " + path + ": " + std::to_string(path.size()) +
                                                    " bytes; expected 1.." + std::to_string(sizeof(addr.sun_path) - 1));
  mp::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket(AF_UNIX) for the admin service", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd.get(), 64) != 0)
    return Status(StatusCode::kUnavailable, "admin: could not listen on unix:" + path + ": " + std::strerror(errno) +
                                                " (address in use, or directory missing?)");
  return fd;
}

AdminAcceptor::AdminAcceptor(grpc::Server* server, std::vector<mp::UniqueFd> listeners, ShortageReport report)
    : server_(server), listeners_(std::move(listeners)), report_(std::move(report)) {}

AdminAcceptor::~AdminAcceptor() { stop(); }

StatusOr<std::unique_ptr<AdminAcceptor>> AdminAcceptor::start(grpc::Server* server,
                                                              std::vector<mp::UniqueFd> listeners,
                                                              ShortageReport on_out_of_descriptors) {
  std::unique_ptr<AdminAcceptor> a(
      new AdminAcceptor(server, std::move(listeners), std::move(on_out_of_descriptors)));
  a->wake_fd_ = mp::UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!a->wake_fd_.valid()) return errno_status("eventfd", errno);
  AdminAcceptor* raw = a.get();
  a->thread_ = std::thread([raw] { raw->run(); });
  pthread_setname_np(a->thread_.native_handle(), "mkd-admin-acc");
  return a;
}

void AdminAcceptor::stop() {
  stop_.store(true);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  listeners_.clear();
}

void AdminAcceptor::run() {
  SpareDescriptor spare;
  Clock::time_point resume{}, last_log{};
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    const bool resting = Clock::now() < resume;
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    for (const auto& l : listeners_) fds.push_back({resting ? -1 : l.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), resting ? 20 : 200) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stop_.load()) break;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      for (int k = 0; k < 16; ++k) {
        const int fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          accepted_.fetch_add(1);
          grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns it from here
          continue;
        }
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) continue;
        if (is_descriptor_exhaustion(e)) {
          // Note 2. Counted and reported before the connection is closed, so a client that sees
          // the close also sees the report.
          out_of_descriptors_.fetch_add(1);
          resume = Clock::now() + std::chrono::milliseconds(100);
          if (report_) {
            report_(Status(StatusCode::kResourceExhausted,
                           std::string("admin and health service: no descriptor to accept a connection (") +
                               std::strerror(e) + "); it was closed, accepting resumes once descriptors are free"));
          } else if (Clock::now() - last_log >= std::chrono::seconds(1)) {
            last_log = Clock::now();
            spdlog::warn("admin: no descriptor to accept a connection ({}); {} so far; accepting resumes once "
                         "descriptors are free",
                         std::strerror(e), out_of_descriptors_.load());
          }
          spare.shed_one(fds[i].fd);
        }
        break;
      }
    }
  }
}

}  // namespace mkernel::daemon
