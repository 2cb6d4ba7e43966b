// fabric_transport.h: the libfabric RDM transport (EFA SRD in production; tcp;ofi_rxm and shm
// where there is no RDMA hardware).
//
// Design notes
//  1. One FabricTransport is one communicator: its own fabric, domain, completion queue, address
//     vector, endpoint and memory registrations, created in that order and closed in reverse.
//  2. mr_mode: we offer FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY and
//     FI_MR_ENDPOINT and obey what the provider keeps: descriptors carry a base that is the
//     virtual address (FI_MR_VIRT_ADDR) or 0 (offset addressing), a key the provider chose
//     (FI_MR_PROV_KEY) or one we chose, and registrations are bound to the endpoint and enabled
//     when FI_MR_ENDPOINT is set. Every local buffer is registered, so FI_MR_LOCAL costs nothing.
//  3. Signals travel one of two ways (SignalValuePath, chosen at open; FabricOptions::signal_value):
//     - kCqData: a write with a signal is fi_writedata; the signal is packed into the provider's
//       remote CQ data (see SignalEncoding) and the receiving transport reports an Arrival when
//       the completion with that data comes out of its completion queue. One operation, but the
//       value keeps only its low 40 bits (8-byte CQ data) or 12 bits (4-byte, EFA) and the
//       receiver rebuilds the rest, which limits the values a flag may take. A signal with no
//       data (length 0; WriteOp's regions are then ignored) is a 1-byte write with data from our
//       scratch region to the peer's, whose key and address travel in the endpoint blob.
//     - kMessage: the whole 64-bit value travels in a 16-byte message (SignalMessage) that is
//       sent only once the data write's delivery-complete completion came back, so on an
//       unordered provider (EFA SRD) the signal cannot overtake the data; the receiver reports
//       the Arrival when the message's receive completes. Any value, any step, any first value.
//       Two operations and one round trip more per signalled write.
//     Every endpoint keeps 16-byte receives posted and accepts both kinds from any peer, so the
//     path is the sender's choice alone. Arrivals of one (peer, flag) never go backwards: two
//     signals of one flag in flight may land in either order, and the later one to land reports
//     the larger of its value and the last reported.
//  5. Writes are delivery-complete where the provider offers it (tcp;ofi_rxm, shm, efa): a
//     successful Completion means the data reached the target's memory, and a write the target
//     refuses (withdrawn registration) comes back as an error. Capabilities::version says which.
//  4. Progress is manual: poll() reads the completion queue; post_write reads it too when the
//     provider answers -FI_EAGAIN, then retries a few times before returning kUnavailable.
//  6. Writes in pieces (FabricOptions::write_piece_bytes): a write longer than the piece size
//     goes to the provider one piece at a time (the next is posted when the one before it
//     completed), and such writes one after another in post order; writes no longer than a
//     piece go at once, as before. The signal goes with the last piece (CQ data) or after it
//     (message), so it still follows all of the write's data. Why: a fused kernel puts a shard in
//     chunks of several MiB and its receiver consumes them in order. Posted at once, shm served
//     the chunks of a burst side by side, so the first landed only with the last (a 64 MiB
//     burst of eight 8 MiB writes: the first signal 13 ms after it began, then all at once);
//     and one write at a time moved more bytes per second (raw fi_writedata, 8 MiB writes: 11.0
//     GB/s with one in flight, 7.9 with eight; 1 MiB: 14.6 / 13.0). One piece in flight costs a
//     completion round trip per piece, nothing on one host but a network round trip per piece
//     on tcp between hosts, so the default is pieces for shm only, of 256 KiB (in the fused op's
//     path between two emulated nodes 64 KiB, 256 KiB, 1 MiB and 4 MiB pieces took 25.6,
//     21.4-22.7, 22.6-24.9 and 24.9 ms for 64 MiB each way, whole writes 29.2). The completion bound counts
//     from the post, queueing behind earlier writes included.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mkernel/common/status.h"
#include "net_transport.h"

namespace mkernel::daemon::net {

// How a signal's 64-bit value reaches the peer (design note 3).
enum class SignalValuePath : uint8_t {
  kAuto = 0,     // kCqData with 8-byte CQ data; kMessage with less (EFA's 4 bytes), where the
                 // provider completes writes at delivery, else kCqData with its limits
  kCqData = 1,   // packed into the write's remote CQ data (one operation, 40 or 12 value bits)
  kMessage = 2,  // the whole value in a message after the data's delivery-complete completion
};
// "auto", "cq_data", "message" (the names the daemon's config uses); "?" for anything else.
std::string_view to_string(SignalValuePath path);

// FabricOptions::write_piece_bytes: the provider's own choice (design note 6).
inline constexpr uint64_t kAutoWritePiece = ~uint64_t{0};
// What kAutoWritePiece means for a provider: 256 KiB for "shm", 0 (whole writes) otherwise.
uint64_t auto_write_piece_bytes(std::string_view provider);

struct FabricOptions {
  // libfabric provider: "tcp;ofi_rxm", "shm", "efa", or "" for the first the library offers.
  std::string provider;
  // Domain (NIC) name, e.g. "lo" or "eth0" for tcp, "rdmap16s27-rdm" for EFA; "" = any.
  std::string domain;
  // Writes in flight before post_write answers kUnavailable (also capped by the provider's
  // transmit queue size).
  uint32_t max_inflight = 256;
  // Receives kept posted when the provider's mode requires them for remote CQ data.
  uint32_t posted_receives = 256;
  // Address-vector size hint (peers of this communicator).
  uint32_t av_size = 64;
  // A write the provider has not completed after this long is reported as kDeadlineExceeded
  // (some providers lose writes the target refuses); its context stays quarantined until the
  // provider returns it, so a late answer is dropped, never reported twice.
  uint32_t completion_timeout_ms = 30000;
  // How signal values travel (design note 3). kMessage needs delivery-complete writes; open
  // refuses it (kFailedPrecondition, naming the field) where the provider does not offer them.
  // kMessage forced on a provider with 8-byte CQ data is how that path is tested without EFA.
  SignalValuePath signal_value = SignalValuePath::kAuto;
  // Writes longer than this go to the provider in pieces of this many bytes, one at a time and
  // in post order (design note 6). kAutoWritePiece: auto_write_piece_bytes(provider); 0:
  // every write is one operation; else at least 4096.
  uint64_t write_piece_bytes = kAutoWritePiece;
};

// Opens a transport. Fails with kNotFound (and libfabric's reason) when no provider matches, or
// kDeviceError when a resource cannot be created. Blocks for resource creation only.
StatusOr<std::unique_ptr<Transport>> open_fabric(const FabricOptions& options);

// ---- remote CQ data encoding (pure; tested directly) -------------------------------------------
//
// A signal (flag index, 64-bit value) travels in the provider's remote CQ data:
//   8 bytes: bits 63..40 = index (24 bits), bits 39..0 = value's low 40 bits
//   4 bytes: bits 31..12 = index (20 bits), bits 11..0  = value's low 12 bits (EFA)
// The receiver rebuilds the full value as the smallest value greater than the last value it
// saw for that (peer, flag) whose low bits match (the first value seen for a flag is taken as
// its low bits). Limit: for each (peer, flag) the values the receiver observes must increase and
// each step must be smaller than 2^value_bits (4096 with 4-byte data). The sender checks both
// against the values it has posted; a provider that delivers out of order (EFA SRD) must
// therefore not have two signals of one flag in flight when their order matters. None of this
// applies to SignalValuePath::kMessage, which carries the whole value.
struct SignalEncoding {
  uint32_t cq_data_bytes = 0;  // 0: no signals
  unsigned index_bits = 0;
  unsigned value_bits = 0;
};

// The encoding for a provider's cq_data_size (8 or more -> 8-byte layout, 4..7 -> 4-byte
// layout, less -> none).
SignalEncoding signal_encoding_for(size_t cq_data_size);
// Packs a signal; kInvalidArgument when the index does not fit.
StatusOr<uint64_t> encode_signal(const SignalEncoding& encoding, uint32_t signal_idx,
                                 uint64_t value);
// Splits CQ data into index and low value bits.
void decode_signal(const SignalEncoding& encoding, uint64_t data, uint32_t* signal_idx,
                   uint64_t* low_value);
// The smallest value greater than `last` whose low `value_bits` bits equal `low_value`; when
// `has_last` is false, `low_value` itself. value_bits == 64 returns low_value.
uint64_t unwrap_signal_value(bool has_last, uint64_t last, uint64_t low_value,
                             unsigned value_bits);

// ---- the signal message (SignalValuePath::kMessage; pure, tested directly) ------------------------
//
// 16 bytes, little-endian: magic "MKSV" (u32), flag index (u32), value (u64). The receiver
// takes a receive of any other length or magic as foreign and drops it (counted).
inline constexpr size_t kSignalMessageBytes = 16;
inline constexpr uint32_t kSignalMessageMagic = 0x4d4b5356;  // "MKSV"
void pack_signal_message(uint32_t signal_idx, uint64_t value, uint8_t* out);
// False (nothing written) for a length or magic that is not ours.
bool unpack_signal_message(const uint8_t* bytes, size_t length, uint32_t* signal_idx,
                           uint64_t* value);

// "[FI_MR_LOCAL, FI_MR_VIRT_ADDR]" for logs and Capabilities::version.
std::string mr_mode_string(uint64_t mr_mode);

}  // namespace mkernel::daemon::net
