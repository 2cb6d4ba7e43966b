#include "transport.h"

#include <atomic>
#include <cstring>

#include "session.h"

namespace mkernel::daemon {

namespace mp = mkernel::protocol;

Status LoopbackTransport::execute(Session& src, const PeerList& peers, const mp::Command& cmd,
                                  mp::RejectReason* reject) {
  if (cmd.op == mp::kOpFence) return Status::Ok();  // synchronous: everything before is done
  Session* dst = cmd.dst_rank < peers.size() ? peers[cmd.dst_rank].get() : nullptr;
  if (dst == nullptr || dst->ended())
    return Status(StatusCode::kUnavailable,
                  "rank " + std::to_string(cmd.dst_rank) + " of communicator \"" +
                      src.identity().communicator + "\" is not connected to this daemon");
  // Check everything at the destination before touching anything.
  const bool writes = cmd.op == mp::kOpWrite || cmd.op == mp::kOpWriteSignal;
  const bool signals = cmd.op == mp::kOpWriteSignal || cmd.op == mp::kOpSignal;
  const Region* d = writes ? dst->region(cmd.dst_region) : nullptr;
  if (writes) {
    if (d == nullptr || !d->remote_writable) {
      *reject = mp::kRejectBadRegion;
      return Status::Ok();
    }
    if (cmd.dst_offset > d->bytes || cmd.num_bytes > d->bytes - cmd.dst_offset) {
      *reject = mp::kRejectBadOffset;
      return Status::Ok();
    }
  }
  uint64_t* flags = signals ? dst->flags() : nullptr;
  if (signals && (flags == nullptr || cmd.signal_idx >= dst->num_flags())) {
    *reject = mp::kRejectBadSignal;
    return Status::Ok();
  }
  if (writes) {
    const Region* s = src.region(cmd.src_region);
    // GPU memory is the NIC's to reach; routes send other ranks with it through the network, so
    // only a rank writing to itself (over a transport that cannot address itself) gets here.
    if (s->gpu() || d->gpu())
      return Status(StatusCode::kFailedPrecondition,
                    std::string(s->gpu() ? "source" : "destination") +
                        " region is GPU memory, which this daemon never maps; a rank copies within its "
                        "own GPU memory with its kernels, other ranks reach it through the network "
                        "transport");
    std::memmove(d->data() + cmd.dst_offset, s->data() + cmd.src_offset, cmd.num_bytes);
  }
  // Release: a reader that acquires the flag sees the data written above.
  if (signals)
    std::atomic_ref<uint64_t>(flags[cmd.signal_idx]).store(cmd.signal_value, std::memory_order_release);
  return Status::Ok();
}

}  // namespace mkernel::daemon
