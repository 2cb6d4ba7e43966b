// rendezvous.h: the root daemon's side of communicator rendezvous (peer.proto) and the joining
// side's call.
//
// Design notes
//  1. The first Join of a communicator id creates its entry with the size and token it carries;
//     every later Join must agree on both (a wrong token is refused without saying what the
//     right one is). A rank joins once; joining again with the same request is idempotent.
//  2. Every Join waits, bounded by the smaller of its own deadline and the root's rendezvous
//     timeout. Expiry names the ranks still missing. When all ranks are in, every waiter gets
//     the same table; the entry is dropped when its last waiter leaves (table in hand or timed
//     out), so the same id can form again (a restarted job).
//  3. At most `max_pending` communicators may be forming at once; more are refused, so strangers
//     cannot make the root hold unbounded state.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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
  struct Forming {
    uint32_t size = 0;
    std::string token;
    std::map<uint32_t, peer::v1::RankEntry> entries;
    uint32_t waiting = 0;  // Joins of this formation still in progress
    bool complete = false;
  };

  RendezvousOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Forming>> forming_;
};

// The joining side: sends `request` to the root daemon's peer service on `channel` and waits up
// to `timeout` for the table.
StatusOr<peer::v1::JoinReply> rendezvous_join(const std::shared_ptr<grpc::Channel>& channel,
                                              const peer::v1::JoinRequest& request,
                                              std::chrono::milliseconds timeout);

}  // namespace mkernel::daemon
