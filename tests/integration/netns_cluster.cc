#include "netns_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

extern char** environ;

namespace mkt {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for `pid` up to `bound`; returns its wait status, -1 on timeout, -2 when it is not our
// child.
int wait_child(pid_t pid, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0) return -2;
    if (Clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string read_file(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

bool pid_alive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// "mkc<pid><rest>" -> pid, or -1 when the name is not ours.
long owner_pid(const std::string& name) {
  if (name.rfind("mkc", 0) != 0) return -1;
  size_t k = 3;
  long pid = 0;
  while (k < name.size() && name[k] >= '0' && name[k] <= '9') pid = pid * 10 + (name[k++] - '0');
  if (k == 3 || k == name.size()) return -1;
  return pid;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string NetnsCluster::find_tool(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* p = std::getenv("PATH")) {
    std::stringstream ss(p);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.push_back(d);
  }
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.emplace_back(d);
  for (const auto& d : dirs) {
    const std::string p = d + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

NetnsCluster::NetnsCluster(int nodes, int subnet)
    : nodes_(nodes), subnet_(subnet), prefix_("mkc" + std::to_string(::getpid())) {
  if (const char* no = std::getenv("MKERNEL_TEST_NO_NETNS"); no != nullptr && std::strcmp(no, "1") == 0) {
    fallback_reason_ = "MKERNEL_TEST_NO_NETNS=1 is set";
  } else if (::geteuid() != 0) {
    fallback_reason_ = "not running as root (euid " + std::to_string(::geteuid()) +
                       "): network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN";
  } else if ((ip_path_ = find_tool("ip")).empty()) {
    fallback_reason_ = "the `ip` tool (iproute2) is not installed";
  } else {
    nft_path_ = find_tool("nft");
    remove_stale();
    fallback_reason_ = build();
    isolated_ = fallback_reason_.empty();
  }
  if (isolated_) {
    std::fprintf(stderr, "netns_cluster: %d namespaces %sn0..%d on bridge %sbr, 10.199.%d.1..%d/24\n",
                 nodes_, prefix_.c_str(), nodes_ - 1, prefix_.c_str(), subnet_, nodes_);
  } else {
    std::fprintf(stderr, "netns_cluster: no network namespaces (%s); every node is 127.0.0.1 with "
                         "its own ports, and tests that need loss or link control skip\n",
                 fallback_reason_.c_str());
  }
}

NetnsCluster::~NetnsCluster() { teardown(); }

std::string NetnsCluster::ns_name(int i) const {
  return isolated_ ? prefix_ + "n" + std::to_string(i) : std::string();
}

std::string NetnsCluster::address(int i) const { return isolated_ ? ns_address(i) : "127.0.0.1"; }

std::string NetnsCluster::iface(int i) const { return isolated_ ? ns_iface(i) : "lo"; }

std::string NetnsCluster::ns_address(int i) const {
  return "10.199." + std::to_string(subnet_) + "." + std::to_string(i + 1);
}

std::string NetnsCluster::ns_iface(int i) const { return "mk" + std::to_string(i); }

std::string NetnsCluster::ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ip_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto [rc, out] = run_in(-1, argv);
  if (rc == 0) return "";
  std::string cmd = "ip";
  for (const auto& a : args) cmd += " " + a;
  return "`" + cmd + "` failed (exit " + std::to_string(rc) + "): " + trim(out);
}

std::string NetnsCluster::build() {
  const std::string br = prefix_ + "br";
  if (std::string e = ip({"link", "add", br, "type", "bridge"}); !e.empty()) return e;
  made_bridge_ = true;
  std::string err = ip({"link", "set", br, "up"});
  for (int i = 0; i < nodes_ && err.empty(); ++i) {
    const std::string ns = prefix_ + "n" + std::to_string(i);
    const std::string root_end = prefix_ + "v" + std::to_string(i);
    const std::string addr = ns_address(i) + "/24";
    if (err = ip({"netns", "add", ns}); !err.empty()) break;
    made_ns_.push_back(ns);
    if (err = ip({"link", "add", root_end, "type", "veth", "peer", "name", ns_iface(i), "netns", ns}); !err.empty())
      break;
    made_veths_.push_back(root_end);
    for (const std::vector<std::string>& step : std::vector<std::vector<std::string>>{
             {"link", "set", root_end, "master", br},
             {"link", "set", root_end, "up"},
             {"-n", ns, "link", "set", "lo", "up"},
             {"-n", ns, "addr", "add", addr, "dev", ns_iface(i)},
             {"-n", ns, "link", "set", ns_iface(i), "up"}}) {
      if (err = ip(step); !err.empty()) break;
    }
  }
  if (!err.empty()) {
    teardown();
    return err;
  }
  return "";
}

void NetnsCluster::teardown() {
  for (pid_t pid : children_) {
    if (::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      wait_child(pid, std::chrono::seconds(10));
    }
  }
  children_.clear();
  // The pairs first (deleting the root end takes the other with it at once; a deleted namespace
  // frees its devices only later, asynchronously), then the namespaces, the bridge last.
  for (const auto& v : made_veths_) {
    const std::string e = ip({"link", "del", v});
    if (!e.empty()) std::fprintf(stderr, "netns_cluster: teardown: %s\n", e.c_str());
  }
  made_veths_.clear();
  for (const auto& ns : made_ns_) {
    const std::string e = ip({"netns", "del", ns});
    if (!e.empty()) std::fprintf(stderr, "netns_cluster: teardown: %s\n", e.c_str());
  }
  made_ns_.clear();
  if (made_bridge_) {
    const std::string e = ip({"link", "del", prefix_ + "br"});
    if (!e.empty()) std::fprintf(stderr, "netns_cluster: teardown: %s\n", e.c_str());
    made_bridge_ = false;
  }
}

void NetnsCluster::remove_stale() {
  std::vector<std::string> stale_ns;
  if (DIR* d = ::opendir("/run/netns")) {
    while (dirent* e = ::readdir(d)) {
      const long pid = owner_pid(e->d_name);
      if (pid > 0 && !pid_alive(pid)) stale_ns.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  for (const auto& ns : stale_ns) {
    std::fprintf(stderr, "netns_cluster: deleting namespace %s left by a test process that is gone\n",
                 ns.c_str());
    (void)ip({"netns", "del", ns});
  }
  // Bridges and root veth ends: every interface name is a directory in /sys/class/net.
  std::vector<std::string> stale_links;
  if (DIR* d = ::opendir("/sys/class/net")) {
    while (dirent* e = ::readdir(d)) {
      const long pid = owner_pid(e->d_name);
      if (pid > 0 && !pid_alive(pid)) stale_links.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(stale_links.begin(), stale_links.end());  // "...br" before "...v<i>"; either order works
  for (const auto& l : stale_links) {
    if (::access(("/sys/class/net/" + l).c_str(), F_OK) != 0) continue;  // went with its peer
    std::fprintf(stderr, "netns_cluster: deleting link %s left by a test process that is gone\n", l.c_str());
    (void)ip({"link", "del", l});
  }
}

pid_t NetnsCluster::spawn_in(int i, const std::vector<std::string>& argv, const std::string& log,
                             const std::vector<std::string>& env) {
  // Everything the child needs is prepared before fork: the parent has threads (gRPC), so the
  // child only makes system calls until exec.
  int ns_fd = -1;
  if (i >= 0 && isolated_) {
    ns_fd = ::open(("/run/netns/" + ns_name(i)).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) return -1;
  }
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    if (ns_fd >= 0 && ::setns(ns_fd, CLONE_NEWNET) != 0) ::_exit(125);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  if (ns_fd >= 0) ::close(ns_fd);
  if (pid > 0) children_.push_back(pid);
  return pid;
}

void NetnsCluster::forget(pid_t pid) {
  children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
}

std::pair<int, std::string> NetnsCluster::run_in(int i, const std::vector<std::string>& argv,
                                                 std::chrono::milliseconds bound) {
  char tmpl[] = "/tmp/mkernel-netns-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  const pid_t pid = spawn_in(i, argv, tmpl);
  if (pid < 0) {
    ::unlink(tmpl);
    return {-1, "fork failed or namespace missing"};
  }
  int st = wait_child(pid, bound);
  if (st == -1) {
    ::kill(pid, SIGKILL);
    st = wait_child(pid, std::chrono::seconds(5));
  }
  forget(pid);
  std::string out = read_file(tmpl);
  ::unlink(tmpl);
  if (st >= 0 && WIFEXITED(st)) {
    const int rc = WEXITSTATUS(st);
    if (rc == 125) out += "(setns into " + ns_name(i) + " failed)";
    if (rc == 127) out += "(exec of " + argv[0] + " failed)";
    return {rc, out};
  }
  return {-1, out + (st == -1 ? "(killed after the time bound)" : "(did not exit normally)")};
}

std::string NetnsCluster::add_loss(int i, int percent) {
  if (!isolated_) return "no network namespaces: " + fallback_reason_;
  if (nft_path_.empty()) return "the `nft` tool (nftables) is not installed";
  const std::string rules =
      "add table inet mkloss; add chain inet mkloss output { type filter hook output priority 0 ; } ; "
      "add rule inet mkloss output oifname \"" + iface(i) + "\" numgen random mod 100 < " +
      std::to_string(percent) + " counter drop";
  const auto [rc, out] = run_in(i, {nft_path_, rules});
  if (rc == 0) return "";
  return "nft in " + ns_name(i) + " (" + rules + ") failed (exit " + std::to_string(rc) + "): " + trim(out);
}

int64_t NetnsCluster::loss_dropped(int i) {
  if (!isolated_ || nft_path_.empty()) return -1;
  const auto [rc, out] = run_in(i, {nft_path_, "list table inet mkloss"});
  const size_t p = out.find("counter packets ");
  if (rc != 0 || p == std::string::npos) return -1;
  return std::strtoll(out.c_str() + p + std::strlen("counter packets "), nullptr, 10);
}

std::string NetnsCluster::remove_loss(int i) {
  if (!isolated_) return "no network namespaces: " + fallback_reason_;
  if (nft_path_.empty()) return "the `nft` tool (nftables) is not installed";
  const auto [rc, out] = run_in(i, {nft_path_, "delete table inet mkloss"});
  if (rc == 0) return "";
  return "nft delete table inet mkloss in " + ns_name(i) + " failed (exit " + std::to_string(rc) +
         "): " + trim(out);
}

std::string NetnsCluster::set_link(int i, bool up) {
  if (!isolated_) return "no network namespaces: " + fallback_reason_;
  return ip({"link", "set", prefix_ + "v" + std::to_string(i), up ? "up" : "down"});
}

}  // namespace mkt
