// rendezvous.h: the root daemon's side of communicator rendezvous (peer.proto) and the joining
// side's call.
//
// Design notes
//  1. Rank 0's token is the communicator's. Joins that arrive before rank 0 wait in a group of
//     their own token (one group per distinct token, at most kMaxTokenGroups), so whoever comes
//     first cannot claim the id: when rank 0 joins, the waiters of every other token are refused
//     at once, and later joins are checked on arrival (a wrong token is refused without saying
//     what the right one is). Within a token every Join must agree on the size. A rank joins
//     once; joining again with the same request is idempotent.
//  2. Every Join waits, bounded by the smaller of its own deadline and the root's rendezvous
//     timeout. Expiry names the ranks still missing. When all ranks are in, every waiter gets
//     the same table; the entry is dropped when its last waiter leaves (table in hand or timed
//     out), so the same id can form again (a restarted job).
//  3. At most `max_pending` communicators may be forming at once; more are refused, so strangers
//     cannot make the root hold unbounded state.
//  4. A refused token is logged with the caller's address, at most kRefusalLinesPerSecond lines
//     a second (the next line says how many were left out).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/proto/peer.grpc.pb.h"

namespace mkernel::daemon {

struct RendezvousOptions {
  std::chrono::milliseconds timeout{120000};  // timeouts.rendezvous
  size_t max_pending = 1024;
  uint32_t max_size = 1u << 20;
};

class RendezvousService final : public peer::v1::Peer::Service {
 public:
  explicit RendezvousService(RendezvousOptions options) : options_(options) {}

  grpc::Status Join(grpc::ServerContext* context, const peer::v1::JoinRequest* request,
                    peer::v1::JoinReply* reply) override;

  size_t pending() const;
  // Reload: a new bound on communicators forming at once (those already forming stay).
  void set_max_pending(size_t max_pending);

 private:
  // The joins of one communicator id that carry the same token.
  struct Group {
    uint32_t size = 0;
    std::string token;
    std::map<uint32_t, peer::v1::RankEntry> entries;
    uint32_t waiting = 0;  // Joins of this group still in progress
    bool complete = false;
  };
  struct Forming {
    std::vector<std::shared_ptr<Group>> groups;
    // Rank 0's token, once rank 0 joined; it outlives rank 0's group, so waiters of other tokens
    // woken after that group finished are still refused.
    bool owned = false;
    std::string owner_token;
  };
  static constexpr size_t kMaxTokenGroups = 8;
  static constexpr int kRefusalLinesPerSecond = 5;

  RendezvousOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Forming>> forming_;
  std::chrono::steady_clock::time_point refusal_window_{};  // wrong-token log lines, under mu_
  int refusal_lines_ = 0;
  uint64_t refusals_unlogged_ = 0;
};

// The joining side: sends `request` to the root daemon's peer service on `channel` and waits up
// to `timeout` for the table.
StatusOr<peer::v1::JoinReply> rendezvous_join(const std::shared_ptr<grpc::Channel>& channel,
                                              const peer::v1::JoinRequest& request,
                                              std::chrono::milliseconds timeout);

}  // namespace mkernel::daemon
