// verbs_transport.h: the libibverbs (InfiniBand / RoCE RC) implementation of net::Transport.
//
// Design notes
//  1. Queue pairs: one RC queue pair per remote rank. Because a communicator gathers one address
//     blob per rank (verbs_wire.h note 2), the queue pairs are created (and moved RESET->INIT)
//     when the address is first taken; add_peer moves the one for that rank INIT->RTR->RTS. The
//     peer index add_peer returns is the peer's rank.
//  2. Signals: RC executes the RDMA writes of one queue pair in order, so a WriteOp with a signal
//     is posted as two chained work requests on the peer's queue pair: the data write, then an
//     8-byte RDMA write of signal_value into slot signal_idx of the peer's signal region. The
//     signal region is the peer's: it registers its flag array (remote_writable) and names it
//     with Transport::set_signal_region before taking its address, and the address carries it.
//     Capabilities: ordered_writes = true, signals = kSignalRegion (no arrivals: the flag is
//     written by the NIC, no proxy raises it).
//  3. No relaxed ordering, ever: with IBV_ACCESS_RELAXED_ORDERING the NIC may let the flag's PCIe
//     write overtake the data's into GPU memory (DESIGN.md section 2), and a kernel that sees
//     the flag would read stale data. The bandwidth it buys is not worth a fence per signal.
//     GPU memory needs more: the data goes to the GPU's BAR while the flag goes to host memory,
//     two PCIe destinations whose writes are not ordered with each other. So a signalled write
//     into a region the peer registered as GPU memory (dmabuf; its descriptor says so) is
//     posted as data write -> RDMA read of the data's last bytes -> flag write with
//     IBV_SEND_FENCE: the read's response comes back only after the writes before it reached
//     the GPU (a read pushes earlier posted writes to the same target), and the fence holds the
//     flag until then. Such regions grant remote read for that purpose. One extra round trip
//     per signal into GPU memory; none for host memory or unsignalled writes.
//  4. Selective signalling: a data write is signalled every `signal_every`-th work request on its
//     queue pair, a signal write always. A completion retires every earlier work request of its
//     queue pair. When a queue pair's last work request is unsignalled and nothing signalled is
//     in flight on it, poll() posts a signalled zero-length write so that its Completion still
//     comes (net_transport.h note 7). Work requests in flight are bounded by
//     `max_outstanding_wr` (transport-wide); post_write returns kUnavailable at the bound.
//  5. Lifetime: members are declared context -> protection domain -> memory regions ->
//     completion queue -> queue pairs and destroyed in reverse (rdma-core's rc_pingpong order).
//  6. A failed completion queue (ibv_poll_cq < 0) breaks the endpoint: async_error() reports it,
//     everything in flight fails with it and so does every later post.
//  7. All libibverbs calls go through VerbsApi (verbs_api.h) so that tests drive this code
//     against a recording fake. Nothing here logs; errors never carry keys or addresses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mkernel/common/status.h"
#include "net_transport.h"
#include "verbs_api.h"

namespace mkernel::daemon::net {

struct VerbsOptions {
  std::string device;               // e.g. "mlx5_0"; "" = the first device with `port` active
  uint8_t port = 1;                 // ibv port number (1-based)
  int gid_index = 0;                // GID table index (RoCE needs the right one; v2 is often 3)
  uint32_t max_outstanding_wr = 256;  // work requests in flight, all queue pairs together
  uint32_t signal_every = 16;       // signal every Nth data write per queue pair (1..bound)
  uint32_t rank = 0;                // this endpoint's rank in its communicator
  uint32_t num_ranks = 1;           // communicator size: one queue pair per other rank
  uint32_t max_inline = 64;         // inline data asked for; the 8-byte signal goes inline if
                                    // the provider grants at least 8
  // RC timing (ibv_qp_attr): local ACK timeout 4.096us * 2^timeout, retries, RNR retries.
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;
  uint8_t service_level = 0;
  uint8_t hop_limit = 64;           // GRH hop limit (RoCE, routed IB)
  uint8_t traffic_class = 0;
};

// Checks the options alone (no device needed); each error names the field, value and range.
Status validate(const VerbsOptions& options);

// Opens the device, allocates the protection domain, the signal staging buffer and the
// completion queue. kUnavailable when no RDMA device exists (the message says so plainly) or
// none has the port active; kNotFound for a named device that is not there.
StatusOr<std::unique_ptr<Transport>> open_verbs(const VerbsOptions& options);
// Same, through `api` (tests pass a fake).
StatusOr<std::unique_ptr<Transport>> open_verbs(const VerbsOptions& options,
                                                std::shared_ptr<VerbsApi> api);

// The enum name of a work completion status ("IBV_WC_REM_ACCESS_ERR"), and the StatusCode a
// Completion carries for it: kUnavailable (the peer did not answer: retries exceeded, timeout,
// remote abort), kPermissionDenied (key, bound or access right), kFailedPrecondition (flushed:
// the queue pair had already failed), kDeviceError (everything else).
const char* wc_status_name(ibv_wc_status status);
StatusCode wc_status_code(ibv_wc_status status);

// The message open_verbs returns (kUnavailable) when ibv_get_device_list finds no device.
inline constexpr const char* kNoRdmaDeviceMessage =
    "no RDMA device: ibv_get_device_list found none (this kernel has no RDMA support or no NIC "
    "is present)";

}  // namespace mkernel::daemon::net
