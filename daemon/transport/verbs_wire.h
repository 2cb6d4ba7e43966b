// verbs_wire.h: the verbs transport's endpoint address and region descriptor formats.
//
// Design notes
//  1. Both are opaque, secret blobs to everyone outside the transport (net_transport.h note 3):
//     they carry LIDs, GIDs, queue pair numbers, PSNs, virtual addresses and rkeys. Decoding
//     errors name sizes and fields, never a value.
//  2. RC queue pairs are point to point, but a communicator gathers one address blob per rank.
//     So the address carries a table: entry r is the queue pair this endpoint dedicated to rank
//     r (its own entry is zero). Rank a connects its queue pair for b to entry a of b's table.
//  3. The address also carries the endpoint's signal region (the flag array peers write 8-byte
//     signal values into), when one was set before the address was taken: slot i lives at
//     signal_addr + 8 * i.
//  4. Fixed little-endian layout, a magic and a version first, so a blob from another transport
//     or another build is rejected as such rather than misread.
//
//  address (52 + 8 * num_ranks bytes)        region descriptor (32 bytes)
//   0 u32 magic "MKVA"  4 u16 version          0 u32 magic "MKVR"  4 u16 version  6 u16 flags
//   6 u8 link_layer     7 u8 path mtu (enum)   8 u64 addr         16 u64 length
//   8 u16 lid          10 u16 rd_atomic       24 u32 rkey         28 u32 zero
//  12 u32 rank         16 u32 num_ranks
//  20 u8[16] gid
//  36 u64 signal_addr  44 u32 signal_rkey  48 u32 signal_slots (0: no signal region)
//  52 num_ranks x { u32 qpn, u32 psn }         region flags: bit 0 = GPU memory (dmabuf)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mkernel/common/status.h"

namespace mkernel::daemon::net::verbs_wire {

inline constexpr uint32_t kAddressMagic = 0x41564b4du;  // "MKVA"
inline constexpr uint32_t kRegionMagic = 0x52564b4du;   // "MKVR"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kAddressHeaderBytes = 52;
inline constexpr size_t kAddressEntryBytes = 8;
inline constexpr size_t kRegionBytes = 32;
inline constexpr uint32_t kMaxRanks = 1u << 16;

struct QpEntry {
  uint32_t qpn = 0;
  uint32_t psn = 0;
};

struct Address {
  uint8_t link_layer = 0;  // IBV_LINK_LAYER_*
  uint8_t mtu = 0;         // ibv_mtu of the port
  uint16_t lid = 0;
  uint16_t rd_atomic = 0;  // RDMA reads this endpoint answers at once per queue pair (0: 1)
  uint32_t rank = 0;
  uint32_t num_ranks = 0;
  std::array<uint8_t, 16> gid{};
  uint64_t signal_addr = 0;
  uint32_t signal_rkey = 0;
  uint32_t signal_slots = 0;
  std::vector<QpEntry> qps;  // num_ranks entries
};

inline constexpr uint16_t kRegionGpuMemory = 1;

struct Region {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  bool gpu_memory = false;  // registered through dmabuf: writers flush before the flag
};

namespace detail {
inline void put(std::vector<uint8_t>& out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline uint64_t get(std::span<const uint8_t> in, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(in[at + i]) << (8 * i);
  return v;
}
}  // namespace detail

inline std::vector<uint8_t> encode_address(const Address& a) {
  std::vector<uint8_t> out;
  out.reserve(kAddressHeaderBytes + kAddressEntryBytes * a.qps.size());
  detail::put(out, kAddressMagic, 4);
  detail::put(out, kVersion, 2);
  detail::put(out, a.link_layer, 1);
  detail::put(out, a.mtu, 1);
  detail::put(out, a.lid, 2);
  detail::put(out, a.rd_atomic, 2);
  detail::put(out, a.rank, 4);
  detail::put(out, static_cast<uint32_t>(a.qps.size()), 4);
  out.insert(out.end(), a.gid.begin(), a.gid.end());
  detail::put(out, a.signal_addr, 8);
  detail::put(out, a.signal_rkey, 4);
  detail::put(out, a.signal_slots, 4);
  for (const QpEntry& e : a.qps) {
    detail::put(out, e.qpn, 4);
    detail::put(out, e.psn, 4);
  }
  return out;
}

inline StatusOr<Address> decode_address(std::span<const uint8_t> in) {
  if (in.size() < kAddressHeaderBytes)
    return Status(StatusCode::kProtocolError,
                  "verbs address: " + std::to_string(in.size()) + " bytes; expected at least " +
                      std::to_string(kAddressHeaderBytes));
  if (detail::get(in, 0, 4) != kAddressMagic)
    return Status(StatusCode::kProtocolError,
                  "verbs address: bad magic; expected an address made by the verbs transport");
  if (detail::get(in, 4, 2) != kVersion)
    return Status(StatusCode::kProtocolError,
                  "verbs address: version " + std::to_string(detail::get(in, 4, 2)) +
                      "; expected " + std::to_string(kVersion));
  Address a;
  a.link_layer = static_cast<uint8_t>(detail::get(in, 6, 1));
  a.mtu = static_cast<uint8_t>(detail::get(in, 7, 1));
  a.lid = static_cast<uint16_t>(detail::get(in, 8, 2));
  a.rd_atomic = static_cast<uint16_t>(detail::get(in, 10, 2));
  a.rank = static_cast<uint32_t>(detail::get(in, 12, 4));
  a.num_ranks = static_cast<uint32_t>(detail::get(in, 16, 4));
  if (a.num_ranks == 0 || a.num_ranks > kMaxRanks || a.rank >= a.num_ranks)
    return Status(StatusCode::kProtocolError,
                  "verbs address: rank " + std::to_string(a.rank) + " of " +
                      std::to_string(a.num_ranks) + "; expected rank < num_ranks <= " +
                      std::to_string(kMaxRanks));
  const size_t want = kAddressHeaderBytes + kAddressEntryBytes * size_t{a.num_ranks};
  if (in.size() != want)
    return Status(StatusCode::kProtocolError,
                  "verbs address: " + std::to_string(in.size()) + " bytes; expected " +
                      std::to_string(want) + " for " + std::to_string(a.num_ranks) + " ranks");
  for (size_t i = 0; i < a.gid.size(); ++i) a.gid[i] = in[20 + i];
  a.signal_addr = detail::get(in, 36, 8);
  a.signal_rkey = static_cast<uint32_t>(detail::get(in, 44, 4));
  a.signal_slots = static_cast<uint32_t>(detail::get(in, 48, 4));
  a.qps.resize(a.num_ranks);
  for (size_t r = 0; r < a.num_ranks; ++r) {
    const size_t at = kAddressHeaderBytes + kAddressEntryBytes * r;
    a.qps[r].qpn = static_cast<uint32_t>(detail::get(in, at, 4));
    a.qps[r].psn = static_cast<uint32_t>(detail::get(in, at + 4, 4));
  }
  return a;
}

inline std::vector<uint8_t> encode_region(const Region& r) {
  std::vector<uint8_t> out;
  out.reserve(kRegionBytes);
  detail::put(out, kRegionMagic, 4);
  detail::put(out, kVersion, 2);
  detail::put(out, r.gpu_memory ? kRegionGpuMemory : 0, 2);
  detail::put(out, r.addr, 8);
  detail::put(out, r.length, 8);
  detail::put(out, r.rkey, 4);
  detail::put(out, 0, 4);
  return out;
}

inline StatusOr<Region> decode_region(std::span<const uint8_t> in) {
  if (in.size() != kRegionBytes)
    return Status(StatusCode::kProtocolError,
                  "verbs region descriptor: " + std::to_string(in.size()) + " bytes; expected " +
                      std::to_string(kRegionBytes) +
                      " (regions registered without remote_writable export no descriptor)");
  if (detail::get(in, 0, 4) != kRegionMagic || detail::get(in, 4, 2) != kVersion)
    return Status(StatusCode::kProtocolError,
                  "verbs region descriptor: bad magic or version; expected a descriptor made by "
                  "the verbs transport, version " + std::to_string(kVersion));
  const uint64_t flags = detail::get(in, 6, 2);
  if ((flags & ~uint64_t{kRegionGpuMemory}) != 0)
    return Status(StatusCode::kProtocolError,
                  "verbs region descriptor: unknown flags " + std::to_string(flags) + "; expected bit 0 at most");
  Region r;
  r.gpu_memory = (flags & kRegionGpuMemory) != 0;
  r.addr = detail::get(in, 8, 8);
  r.length = detail::get(in, 16, 8);
  r.rkey = static_cast<uint32_t>(detail::get(in, 24, 4));
  return r;
}

}  // namespace mkernel::daemon::net::verbs_wire
