// ledger.h: what clients hold (sessions, rings, regions, shared memory, descriptors, connects in
// progress), added up per client process, per uid and for the node, and checked against the
// limits of config.clients so that no client can take what the others need.
//
// Design notes
//  1. The owner of a session is its peer credentials at accept (SO_PEERCRED): uid and pid. A
//     session holds a Holding; every change goes through take() and give_back(), so the three
//     sums always equal the sum over live sessions.
//  2. take() checks the process's limits, then the uid's, then the node's, and changes nothing
//     when any of them has no room: the Denial names the first limit in the way, its config key
//     and its value. Limits are read at each call (a reload applies to new requests; a client
//     above a lowered limit keeps what it has).
//  3. Descriptors: the node's budget is clients.max_descriptors, lowered when the process's
//     descriptor limit leaves less after the reserve (config::kReservedDescriptors). Only
//     descriptors held for clients are counted here; the reserve is never handed out, which is
//     what keeps the admin and health endpoints reachable. When the budget is lowered, the
//     per-uid and per-process descriptor limits shrink in proportion.
//  4. Thread safety: one mutex. The event loop takes and gives back; the control implementation
//     reads totals.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "mkernel/config/config.h"
#include "refusals.h"

namespace mkernel::daemon {

struct Holding {
  uint32_t sessions = 0;
  uint32_t rings = 0;
  uint32_t regions = 0;
  uint64_t shared_memory = 0;
  uint32_t descriptors = 0;
  uint32_t connects = 0;  // connects in progress
  uint32_t networks = 0;  // sessions with a network endpoint
  Holding& operator+=(const Holding& o);
  Holding& operator-=(const Holding& o);
  bool empty() const;
};

struct Owner {
  uid_t uid = 0;
  pid_t pid = 0;
};

struct LedgerLimits {
  config::ClientsConfig clients;
  uint32_t descriptor_budget = 0;  // note 3
  std::string descriptor_budget_why;  // "" when it is clients.max_descriptors as configured
  // "" when the per-uid and per-process descriptor limits are as configured; else why they are
  // lower (they shrink with the budget, note 3).
  std::string descriptor_share_why;
  uint32_t max_connects_per_uid = 64;
};

class Ledger {
 public:
  // Note 2. nullopt: taken.
  std::optional<Denial> take(const Owner& owner, const Holding& ask, const LedgerLimits& limits);
  void give_back(const Owner& owner, const Holding& what);
  // A session binds to a GPU at its hello: sessions per GPU of the process, the uid and the
  // node (clients.max_per_gpu).
  std::optional<Denial> bind_gpu(const Owner& owner, uint32_t gpu, const LedgerLimits& limits);
  void unbind_gpu(const Owner& owner, uint32_t gpu);

  Holding node() const;
  Holding of_uid(uid_t uid) const;
  Holding of_process(pid_t pid) const;
  uint32_t sessions_on_gpu(uint32_t gpu) const;

 private:
  struct Account {
    Holding held;
    std::map<uint32_t, uint32_t> per_gpu;  // sessions bound to each GPU
    bool empty() const { return held.empty() && per_gpu.empty(); }
  };

  mutable std::mutex mu_;
  std::unordered_map<uid_t, Account> uids_;
  std::unordered_map<pid_t, Account> processes_;
  Account node_;
};

}  // namespace mkernel::daemon
