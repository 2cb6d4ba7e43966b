// Layout of the command record and ring header, and encode/decode of every field at its limits.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>

#include "mkernel/protocol/command.h"
#include "mkernel/protocol/ring.h"
#include "mkernel/protocol/version.h"

namespace mp = mkernel::protocol;

namespace {

mp::CommandRecord encode(const mp::Command& c) {
  mp::CommandRecord r;
  std::memset(&r, 0xA5, sizeof(r));  // every byte the encoder skips would show
  mp::encode_payload(c, r);
  r.commit = 0;
  return r;
}

mp::Command roundtrip(const mp::Command& c, const mp::DecodeLimits& lim = {}) {
  const mp::DecodeResult d = mp::decode(encode(c), lim);
  EXPECT_TRUE(d.ok()) << mp::reject_reason_name(d.reason);
  return d.command;
}

}  // namespace

TEST(ProtocolLayout, RecordIsOneCacheLine) {
  EXPECT_EQ(sizeof(mp::CommandRecord), 64u);
  EXPECT_EQ(alignof(mp::CommandRecord), 64u);
  EXPECT_TRUE(std::is_trivially_copyable_v<mp::CommandRecord>);
  EXPECT_TRUE(std::is_standard_layout_v<mp::CommandRecord>);
  EXPECT_EQ(offsetof(mp::CommandRecord, commit) + sizeof(uint32_t), sizeof(mp::CommandRecord))
      << "the commit word must be the last word of the slot";
}

TEST(ProtocolLayout, FieldOffsets) {
  EXPECT_EQ(offsetof(mp::CommandRecord, src_offset), 0u);
  EXPECT_EQ(offsetof(mp::CommandRecord, dst_offset), 8u);
  EXPECT_EQ(offsetof(mp::CommandRecord, num_bytes), 16u);
  EXPECT_EQ(offsetof(mp::CommandRecord, signal_value), 24u);
  EXPECT_EQ(offsetof(mp::CommandRecord, tag), 32u);
  EXPECT_EQ(offsetof(mp::CommandRecord, dst_rank), 40u);
  EXPECT_EQ(offsetof(mp::CommandRecord, signal_idx), 44u);
  EXPECT_EQ(offsetof(mp::CommandRecord, src_region), 48u);
  EXPECT_EQ(offsetof(mp::CommandRecord, dst_region), 50u);
  EXPECT_EQ(offsetof(mp::CommandRecord, op), 52u);
  EXPECT_EQ(offsetof(mp::CommandRecord, flags), 53u);
  EXPECT_EQ(offsetof(mp::CommandRecord, reserved0), 54u);
  EXPECT_EQ(offsetof(mp::CommandRecord, reserved1), 56u);
  EXPECT_EQ(offsetof(mp::CommandRecord, commit), 60u);
}

TEST(ProtocolLayout, HeaderFieldsOnTheirOwnCacheLines) {
  EXPECT_EQ(sizeof(mp::RingHeader), 7u * 64u);
  const size_t lines[] = {offsetof(mp::RingHeader, head) / 64,
                          offsetof(mp::RingHeader, tail) / 64,
                          offsetof(mp::RingHeader, completed) / 64,
                          offsetof(mp::RingHeader, error) / 64,
                          offsetof(mp::RingHeader, epoch) / 64,
                          offsetof(mp::RingHeader, client_error) / 64};
  for (size_t i = 0; i < std::size(lines); ++i)
    for (size_t j = i + 1; j < std::size(lines); ++j) EXPECT_NE(lines[i], lines[j]) << i << " " << j;
  EXPECT_EQ(offsetof(mp::RingHeader, magic) / 64, 0u);
  EXPECT_EQ(mp::kRingSlotsOffset % 4096, 0u);
  EXPECT_EQ(mp::ring_segment_bytes(10), 4096u + 1024u * 64u);
}

TEST(ProtocolLayout, VersionAndCommitWord) {
  EXPECT_EQ(mp::kProtocolVersion, 1u);
  EXPECT_EQ(mp::commit_word(0, 4), mp::kCommitValid);
  EXPECT_EQ(mp::commit_word(15, 4), mp::kCommitValid);
  EXPECT_EQ(mp::commit_word(16, 4), mp::kCommitValid | 1u);
  // The lap wraps inside 31 bits and the word is never zero.
  EXPECT_EQ(mp::commit_word((uint64_t{1} << 31) << 4, 4), mp::kCommitValid);
  EXPECT_NE(mp::commit_word(~uint64_t{0}, 1), 0u);
  EXPECT_FALSE(mp::valid_capacity_log2(0));
  EXPECT_TRUE(mp::valid_capacity_log2(1));
  EXPECT_TRUE(mp::valid_capacity_log2(20));
  EXPECT_FALSE(mp::valid_capacity_log2(21));
}

TEST(ProtocolCodec, WriteFieldsAtTheirLimits) {
  const uint64_t max_bytes = mp::kMaxCommandBytes;
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4096}, max_bytes}) {
    for (uint64_t off : {uint64_t{0}, mp::kMaxOffset + 1 - max_bytes}) {
      for (uint32_t rank : {0u, mp::kMaxRanks - 1}) {
        for (uint16_t region : {uint16_t{0}, uint16_t{mp::kNoRegion - 1}}) {
          const mp::Command c = mp::make_write(rank, region, off, region, off, bytes,
                                               std::numeric_limits<uint64_t>::max());
          EXPECT_EQ(roundtrip(c), c);
        }
      }
    }
  }
}

TEST(ProtocolCodec, WriteSignalAndSignalAndFence) {
  const mp::Command ws = mp::make_write_signal(7, 1, 128, 2, 256, 64, mp::kNoSignal - 1,
                                               std::numeric_limits<uint64_t>::max(), 99);
  EXPECT_EQ(roundtrip(ws), ws);
  const mp::Command s = mp::make_signal(mp::kMaxRanks - 1, 0, 1, 5);
  EXPECT_EQ(roundtrip(s), s);
  const mp::Command f = mp::make_fence(42);
  EXPECT_EQ(roundtrip(f), f);
}

TEST(ProtocolCodec, EncodeWritesEveryPayloadByte) {
  const mp::Command c = mp::make_write_signal(3, 4, 5, 6, 7, 8, 9, 10, 11);
  const mp::CommandRecord r = encode(c);
  EXPECT_EQ(r.flags, 0);
  EXPECT_EQ(r.reserved0, 0);
  EXPECT_EQ(r.reserved1, 0u);
  EXPECT_EQ(r.src_offset, 5u);
  EXPECT_EQ(r.dst_offset, 7u);
  EXPECT_EQ(r.num_bytes, 8u);
  EXPECT_EQ(r.signal_idx, 9u);
  EXPECT_EQ(r.signal_value, 10u);
  EXPECT_EQ(r.tag, 11u);
  EXPECT_EQ(r.op, mp::kOpWriteSignal);
}

struct RejectCase {
  const char* name;
  void (*mutate)(mp::CommandRecord&);
  mp::RejectReason want;
};

TEST(ProtocolCodec, EachBadFieldIsNamed) {
  const RejectCase cases[] = {
      {"op zero", [](mp::CommandRecord& r) { r.op = 0; }, mp::kRejectBadOp},
      {"op past end", [](mp::CommandRecord& r) { r.op = mp::kNumOps; }, mp::kRejectBadOp},
      {"op 255", [](mp::CommandRecord& r) { r.op = 255; }, mp::kRejectBadOp},
      {"flags", [](mp::CommandRecord& r) { r.flags = 1; }, mp::kRejectBadFlags},
      {"reserved0", [](mp::CommandRecord& r) { r.reserved0 = 1; }, mp::kRejectReservedNonzero},
      {"reserved1", [](mp::CommandRecord& r) { r.reserved1 = 0x80000000u; },
       mp::kRejectReservedNonzero},
      {"rank", [](mp::CommandRecord& r) { r.dst_rank = 4; }, mp::kRejectBadRank},
      {"src region", [](mp::CommandRecord& r) { r.src_region = 8; }, mp::kRejectBadRegion},
      {"dst region none", [](mp::CommandRecord& r) { r.dst_region = mp::kNoRegion; },
       mp::kRejectBadRegion},
      {"zero bytes", [](mp::CommandRecord& r) { r.num_bytes = 0; }, mp::kRejectZeroBytes},
      {"too large", [](mp::CommandRecord& r) { r.num_bytes = (1u << 20) + 1; },
       mp::kRejectTooLarge},
      {"src offset", [](mp::CommandRecord& r) { r.src_offset = mp::kMaxOffset + 1; },
       mp::kRejectBadOffset},
      {"dst offset wraps", [](mp::CommandRecord& r) { r.dst_offset = ~uint64_t{0} - 10; },
       mp::kRejectBadOffset},
      {"offset+bytes past end", [](mp::CommandRecord& r) { r.dst_offset = mp::kMaxOffset; },
       mp::kRejectBadOffset},
      {"signal none", [](mp::CommandRecord& r) { r.signal_idx = mp::kNoSignal; },
       mp::kRejectBadSignal},
      {"signal range", [](mp::CommandRecord& r) { r.signal_idx = 16; }, mp::kRejectBadSignal},
      {"signal zero", [](mp::CommandRecord& r) { r.signal_value = 0; },
       mp::kRejectZeroSignalValue},
  };
  mp::DecodeLimits lim;
  lim.num_ranks = 4;
  lim.num_regions = 8;
  lim.num_signals = 16;
  lim.max_bytes = 1u << 20;
  const mp::Command good = mp::make_write_signal(3, 7, 0, 7, 0, 1u << 20, 15, 1);
  ASSERT_TRUE(mp::decode(encode(good), lim).ok());
  for (const RejectCase& c : cases) {
    mp::CommandRecord r = encode(good);
    c.mutate(r);
    const mp::DecodeResult d = mp::decode(r, lim);
    EXPECT_EQ(d.reason, c.want) << c.name << ": got " << mp::reject_reason_name(d.reason);
  }
}

TEST(ProtocolCodec, FieldsAnOpDoesNotUseMustBeEmpty) {
  // A plain write may not carry a signal.
  mp::CommandRecord w = encode(mp::make_write(0, 0, 0, 0, 0, 8));
  w.signal_value = 3;
  EXPECT_EQ(mp::decode(w).reason, mp::kRejectStrayField);
  // A signal may not carry data or regions.
  mp::CommandRecord s = encode(mp::make_signal(0, 0, 1));
  s.num_bytes = 8;
  EXPECT_EQ(mp::decode(s).reason, mp::kRejectStrayField);
  s = encode(mp::make_signal(0, 0, 1));
  s.src_region = 0;
  EXPECT_EQ(mp::decode(s).reason, mp::kRejectBadRegion);
  // A fence names nothing.
  mp::CommandRecord f = encode(mp::make_fence());
  f.dst_rank = 1;
  EXPECT_EQ(mp::decode(f).reason, mp::kRejectStrayField);
  f = encode(mp::make_fence());
  f.signal_idx = 0;
  EXPECT_EQ(mp::decode(f).reason, mp::kRejectBadSignal);
}

TEST(ProtocolCodec, DecodeIsConstexpr) {
  constexpr mp::DecodeResult d = [] {
    mp::CommandRecord r{};
    mp::encode_payload(mp::make_signal(1, 2, 3), r);
    return mp::decode(r);
  }();
  static_assert(d.ok());
  static_assert(d.command.signal_value == 3);
  EXPECT_TRUE(d.ok());
}
