// netns_cluster.h: N network namespaces joined into one network, for multi-node integration
// tests on one machine.
//
// Design notes
//  1. Topology: a bridge in the root namespace and one veth pair per node. The node's end lives
//     in its namespace as `mk<i>` with 10.199.<subnet>.<i+1>/24 (loopback up too); the root end
//     (`mkc<pid>v<i>`) is a port of the bridge (`mkc<pid>br`, no address). A bridge rather than
//     a full mesh so that every node has one interface and one address to advertise, and one
//     link to cut: taking the root end of node i's pair down is a cable pulled out of node i.
//     The bridge has no address, so the root namespace cannot reach the nodes and two clusters
//     with the same subnet never meet.
//  2. Names carry the test process id (`mkc<pid>n<i>`); a namespace, veth or bridge left behind
//     by a test process that no longer exists (killed by a ctest timeout) is deleted when the
//     next cluster is built.
//  3. Teardown always runs (destructor): processes started with spawn_in() that still run are
//     killed (SIGKILL) and reaped, then namespaces (which takes their veth ends and so the pairs
//     with them) and the bridge are deleted. Children also get PR_SET_PDEATHSIG(SIGKILL), so a
//     test process killed outright takes its daemons and clients with it.
//  4. Fallback: when namespaces cannot be made (not root, no CAP_NET_ADMIN, `ip` missing,
//     MKERNEL_TEST_NO_NETNS=1), every node is 127.0.0.1 in the root namespace, the reason is
//     printed and kept in fallback_reason(); loss and link control then return an error and the
//     tests that need them skip with that reason.
//  5. Loss is an nftables rule in the node's namespace (this kernel has no netem): table
//     `inet mkloss`, chain `output` on the output hook, `oifname "mk<i>" numgen random mod 100
//     < N counter drop` (the counter tells a test that packets really were dropped). It drops the node's outgoing packets on the cluster link only, so loopback
//     traffic inside the node is untouched.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mkt {

class NetnsCluster {
 public:
  // Builds `nodes` namespaces (or the loopback fallback, see note 4). Never throws; progress and
  // any fallback reason go to stderr.
  explicit NetnsCluster(int nodes, int subnet = 0);
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // True when the nodes are real namespaces; false in the loopback fallback.
  bool isolated() const { return isolated_; }
  // Why there are no namespaces ("" when isolated()).
  const std::string& fallback_reason() const { return fallback_reason_; }
  int size() const { return nodes_; }

  // Namespace name of node i ("" in the fallback).
  std::string ns_name(int i) const;
  // The node's IPv4 address: 10.199.<subnet>.<i+1>, or 127.0.0.1 in the fallback.
  std::string address(int i) const;
  // The node's interface towards the others: "mk<i>", or "lo" in the fallback.
  std::string iface(int i) const;

  // Starts argv[0] (a path) inside node i's namespace with stdout and stderr appended to `log`
  // and `env` ("NAME=value") added to the environment. The child dies with this process
  // (PR_SET_PDEATHSIG). Returns the pid, or -1 when the fork failed. The cluster remembers the
  // pid and kills it at teardown if it still runs; forget() drops it (after the caller reaped it).
  pid_t spawn_in(int i, const std::vector<std::string>& argv, const std::string& log,
                 const std::vector<std::string>& env = {});
  void forget(pid_t pid);
  // Runs argv inside node i's namespace to completion (bounded; killed after `bound`) and
  // returns {exit code or -1, output}.
  std::pair<int, std::string> run_in(int i, const std::vector<std::string>& argv,
                                     std::chrono::milliseconds bound = std::chrono::seconds(10));

  // nftables loss on node i's cluster link (note 5). Return "" on success, else what failed.
  std::string add_loss(int i, int percent);
  std::string remove_loss(int i);
  // Packets the loss rule of node i dropped so far, or -1 when there is no rule.
  int64_t loss_dropped(int i);
  // Takes node i's cable out (up = false) or puts it back: the root end of its veth pair, so
  // the node keeps its address and routes and only sees the carrier go.
  std::string set_link(int i, bool up);

  // Full path of a tool found in PATH or the usual sbin directories, or "".
  static std::string find_tool(const std::string& name);

 private:
  std::string build();     // "" or why it failed (after undoing what it made)
  void teardown();
  void remove_stale();     // note 2
  std::string ns_address(int i) const;  // the address and interface in the namespace,
  std::string ns_iface(int i) const;    // whether or not the cluster ended up isolated
  std::string ip(const std::vector<std::string>& args);  // runs `ip args...`; "" or the error

  int nodes_;
  int subnet_;
  bool isolated_ = false;
  std::string fallback_reason_;
  std::string ip_path_;
  std::string nft_path_;
  std::string prefix_;  // "mkc<pid>"
  std::vector<std::string> made_ns_;
  std::vector<std::string> made_veths_;  // root ends
  bool made_bridge_ = false;
  std::vector<pid_t> children_;
};

}  // namespace mkt
