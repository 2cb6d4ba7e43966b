// The fused ops' agreement values (kernels/common/comm.cuh: agree_flag_value / agree_flag_floor)
// through the fabric transport's signal encoding (fabric_transport.h): across nodes a signal's
// value travels as its low 40 bits in 8-byte CQ data, the sender refuses a step of 2^40 or more
// on one (peer, flag), and the receiver rebuilds the value from the last one it saw (the first one
// as it is). Every agreement of a long run must reach its readers exactly, and no value left by an
// earlier agreement may satisfy a later agreement's wait.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>

#include "common/comm.cuh"
#include "fabric_transport.h"

namespace mkernel::daemon::net {
namespace {

namespace mk = mkernel::kernels;

// One (peer, flag) pair of the 8-byte encoding: the sender's check and the receiver's rebuild.
struct Channel {
  SignalEncoding enc = signal_encoding_for(8);
  bool sent_any = false, seen_any = false;
  uint64_t last_sent = 0, last_seen = 0;

  // What the transport does with one signal; false where the sender refuses it.
  bool send(uint64_t value, uint64_t* arrived) {
    if (sent_any && (value <= last_sent || ((value - last_sent) >> enc.value_bits) != 0)) return false;
    auto data = encode_signal(enc, 3, value);
    if (!data.ok()) return false;
    uint32_t idx = 0;
    uint64_t low = 0;
    decode_signal(enc, data.value(), &idx, &low);
    *arrived = unwrap_signal_value(seen_any, last_seen, low, enc.value_bits);
    sent_any = seen_any = true;
    last_sent = value;
    last_seen = *arrived;
    return true;
  }
};

TEST(AgreeSignal, EveryAgreementOfALongRunArrivesExactlyWhateverRanBetween) {
  ASSERT_EQ(signal_encoding_for(8).value_bits, 40u);
  std::mt19937_64 rng(20261203);
  // One channel per (bank, word): consecutive agreements alternate between the banks.
  std::map<uint64_t, Channel> channels;
  std::map<uint64_t, uint64_t> flag;  // the reader's flag word per (bank, word)
  for (uint64_t seq = 0; seq < 200000; ++seq) {
    const uint32_t bank = static_cast<uint32_t>(seq % mk::kAgreeBanks);
    for (uint32_t i = 0; i < mk::kAgreeWords; ++i) {
      // Words of any value, 0 and 2^32 - 1 included (sizes, flag counts, byte counts).
      const uint32_t word = rng() % 4 == 0 ? (rng() % 2 ? 0u : 0xFFFFFFFFu) : static_cast<uint32_t>(rng());
      const uint64_t key = uint64_t{bank} * mk::kAgreeWords + i;
      const uint64_t floor = mk::agree_flag_floor(seq);
      // What is left from the bank's previous agreement must not satisfy this one's wait.
      ASSERT_LT(flag[key], floor) << "seq " << seq;
      uint64_t arrived = 0;
      ASSERT_TRUE(channels[key].send(mk::agree_flag_value(seq, word), &arrived)) << "refused at seq " << seq;
      ASSERT_EQ(arrived, mk::agree_flag_value(seq, word)) << "seq " << seq;
      flag[key] = arrived;
      ASSERT_GE(arrived, floor);
      ASSERT_EQ(static_cast<uint32_t>(arrived & 0xFFFFFFFFu), word);
    }
  }
}

// The values the agreement carried before (the launch number << 32): a communicator's first
// agreement after its 256th launch does not arrive as sent, which is what a rank waiting for it
// then reported as "rank q did not take part". Kept as the reason for agree_flag_value.
TEST(AgreeSignal, LaunchNumberValuesWouldNotSurviveTheEncoding) {
  Channel ch;
  const uint64_t launch = 300, value = (launch << 32) | 7;
  uint64_t arrived = 0;
  ASSERT_TRUE(ch.send(value, &arrived));
  EXPECT_NE(arrived, value);
  EXPECT_LT(arrived, launch << 32);
  // And two agreements 256 launches apart on one flag: a step the sender refuses.
  Channel ch2;
  ASSERT_TRUE(ch2.send((uint64_t{2} << 32) | 1, &arrived));
  EXPECT_FALSE(ch2.send((uint64_t{258} << 32) | 1, &arrived));
}

}  // namespace
}  // namespace mkernel::daemon::net
