// verbs_endpoint.h: the verbs transport's endpoint class and the helpers its two source files
// share: verbs_open.cc (opening, queue pairs, addresses, registrations) and verbs_transport.cc
// (the data path: work requests, completions, errors). Private to daemon/transport/: everyone
// else uses verbs_transport.h.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "verbs_transport.h"
#include "verbs_wire.h"

namespace mkernel::daemon::net::verbs {

namespace wire = verbs_wire;

// ---- RAII handles: each releases through the api it came from --------------------------------

template <class T, int (VerbsApi::*kRelease)(T*)>
struct Release {
  VerbsApi* api = nullptr;
  // A failing destroy cannot be reported from a destructor; the object is gone to us either way.
  void operator()(T* p) const {
    if (p != nullptr) (void)(api->*kRelease)(p);
  }
};
using ContextPtr = std::unique_ptr<ibv_context, Release<ibv_context, &VerbsApi::close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, Release<ibv_pd, &VerbsApi::dealloc_pd>>;
using MrPtr = std::unique_ptr<ibv_mr, Release<ibv_mr, &VerbsApi::dereg_mr>>;
using CqPtr = std::unique_ptr<ibv_cq, Release<ibv_cq, &VerbsApi::destroy_cq>>;
using QpPtr = std::unique_ptr<ibv_qp, Release<ibv_qp, &VerbsApi::destroy_qp>>;

class DeviceList {
 public:
  DeviceList(VerbsApi* api, ibv_device** list) : api_(api), list_(list) {}
  ~DeviceList() {
    if (list_ != nullptr) api_->free_device_list(list_);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;

 private:
  VerbsApi* api_;
  ibv_device** list_;
};

inline Status device_error(const std::string& what, int err) {
  return Status(StatusCode::kDeviceError, what + ": " + std::strerror(err));
}

// Seeds the initial PSNs. std::random_device may throw where no entropy source exists; a
// clock-based seed is good enough for PSNs, which only need to differ between connections.
inline uint32_t psn_seed() {
  try {
    return std::random_device{}();
  } catch (...) {
    return static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
}

inline const char* port_state_name(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  }
  return "unknown";
}


class VerbsTransportImpl final : public Transport {
 public:
  VerbsTransportImpl(std::shared_ptr<VerbsApi> api, const VerbsOptions& options)
      : api_(std::move(api)), options_(options), rng_(psn_seed()) {}

  // Reverse of the lifetime order, spelled out: queue pairs (last first), completion queue,
  // memory regions (newest first), the staging region, protection domain, context.
  ~VerbsTransportImpl() override {
    while (!qps_.empty()) qps_.pop_back();
    cq_.reset();
    while (!regions_.empty()) regions_.erase(std::prev(regions_.end()));
    staging_mr_.reset();
    pd_.reset();
    context_.reset();
  }

  Status open();

  const Capabilities& capabilities() const override { return caps_; }
  StatusOr<Blob> local_address() override;
  StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) override;
  StatusOr<Registration> register_memory(const RegisterRequest& request) override;
  Status deregister_memory(uint64_t local_id) override;
  StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) override;
  Status post_write(const WriteOp& op) override;
  size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) override;
  Status set_signal_region(uint64_t local_id) override;
  const Status& async_error() const override { return broken_; }

 private:
  struct LocalRegion {
    MrPtr mr;
    uint64_t addr = 0;  // the address work requests use (the GPU VA for dmabuf)
    uint64_t length = 0;
    bool remote_writable = false;
    uint32_t inflight = 0;  // writes in flight that read from it
  };
  struct RemoteRegion {
    uint32_t peer = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t rkey = 0;
    bool gpu_memory = false;  // flush before the flag (verbs_transport.h note 3)
  };
  struct PendingWr {
    uint64_t seq = 0;
    bool signalled = false;
    int staging_slot = -1;
  };
  struct PendingOp {
    uint64_t cookie = 0;
    uint64_t first_seq = 0;
    uint64_t last_seq = 0;
    uint64_t local_region = 0;  // 0: none (signal only)
    Status status;
  };
  struct QueuePair {
    QpPtr qp;
    uint32_t psn = 0;
    bool inline_signal = false;
    bool connected = false;
    bool failed = false;
    Status failure;
    uint64_t signal_addr = 0;
    uint32_t signal_rkey = 0;
    uint32_t signal_slots = 0;
    uint32_t since_signal = 0;        // unsignalled work requests since the last signalled one
    uint32_t signalled_inflight = 0;
    bool tail_unsignalled = false;
    uint64_t last_remote_addr = 0;    // target of the last write (for the flush write)
    uint32_t last_rkey = 0;
    std::deque<PendingWr> wrs;
    std::deque<PendingOp> ops;
  };

  Status create_queue_pairs();
  Status connect(uint32_t rank, const wire::Address& remote);
  void record_wr(QueuePair& q, uint64_t seq, bool signalled, int slot, uint64_t raddr,
                 uint32_t rkey);
  void handle_completion(const ibv_wc& wc, std::vector<Completion>* completions);
  void retire_through(QueuePair& q, uint64_t seq);
  void complete(const PendingOp& op, std::vector<Completion>* completions);
  void fail_queue_pair(uint32_t rank, const Status& why, std::vector<Completion>* completions);
  void post_flush(uint32_t rank, std::vector<Completion>* completions);
  std::string peer_name(uint32_t rank) const { return "peer " + std::to_string(rank); }

  // Declared in the verbs lifetime order (verbs_transport.h note 5); the destructor releases
  // them in reverse. api_ comes first so that it outlives every handle.
  std::shared_ptr<VerbsApi> api_;
  VerbsOptions options_;
  Capabilities caps_;
  ibv_port_attr port_attr_{};
  ibv_gid gid_{};
  uint64_t max_message_ = 0;

  ContextPtr context_;
  PdPtr pd_;
  std::vector<uint64_t> staging_;  // signal values of flag writes in flight (host memory)
  MrPtr staging_mr_;
  std::map<uint64_t, LocalRegion> regions_;
  CqPtr cq_;
  std::vector<QueuePair> qps_;  // by rank; this endpoint's own entry has no queue pair

  std::vector<int> free_slots_;
  std::unordered_map<uint32_t, uint32_t> rank_by_qpn_;
  std::map<uint64_t, RemoteRegion> remote_regions_;
  uint64_t next_local_id_ = 1;
  uint16_t rd_responder_ = 1;  // RDMA reads answered at once per queue pair (published)
  uint16_t rd_initiator_ = 1;  // RDMA reads issued at once per queue pair (own limit)
  uint64_t next_remote_id_ = 1;
  uint64_t next_seq_ = 1;
  uint32_t outstanding_ = 0;
  uint64_t signal_region_ = 0;
  bool address_published_ = false;
  Status broken_;  // set when the completion queue itself failed (async_error)
  std::vector<Completion> undelivered_;  // made while poll() had nowhere to put them
  std::mt19937 rng_;
};

}  // namespace mkernel::daemon::net::verbs
