// The fused ops' agreement values (kernels/common/comm.cuh: agree_flag_value / agree_flag_floor)
// through the fabric transport's signal encoding (fabric_transport.h): across nodes a signal's
// value travels as its low 40 bits in 8-byte CQ data, the sender refuses a step of 2^40 or more
// on one (peer, flag), and the receiver rebuilds the value from the last one it saw (the first one
// as it is). Every agreement of a long run must reach its readers exactly, and no value left by an
// earlier agreement may satisfy a later agreement's wait. With 4-byte CQ data (EFA) the values
// cannot travel that way at all; there they go by signal message, replayed below through real
// endpoints over tcp;ofi_rxm and shm.
#include <gtest/gtest.h>

#include <cstdint>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

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

// EFA's 4-byte CQ data keeps 12 value bits: no agreement word can be a first value there (the
// sender refuses it), which is why such providers send signal values by message
// (SignalValuePath::kMessage, below).
TEST(AgreeSignal, FourByteCqDataCannotCarryAnAgreementWord) {
  Channel ch;
  ch.enc = signal_encoding_for(4);
  ASSERT_EQ(ch.enc.value_bits, 12u);
  uint64_t arrived = 0;
  const uint64_t first = mk::agree_flag_value(0, 7);
  // The transport's rule (fabric_transport.cc): a first value must be below 2^value_bits.
  EXPECT_NE(first >> ch.enc.value_bits, 0u);
  ASSERT_TRUE(ch.send(7, &arrived));  // a launch-number-like value fits
  EXPECT_FALSE(ch.send(mk::agree_flag_value(1, 7), &arrived)) << "a step of 2^33 is past 4096";
}

// The agreement's values through two real endpoints with signal values sent by message (forced
// here: auto picks it where CQ data has fewer than 8 bytes, EFA, which this machine lacks), over
// libfabric's tcp;ofi_rxm and shm: 600 agreements (past the 256th, where values pass 2^40), 12
// words each into alternating banks, words of any 32-bit value; every word arrives exactly, and
// what a bank held before never satisfies the next agreement's floor.
struct Endpoints {
  std::unique_ptr<Transport> a, b;
  uint32_t b_at_a = 0;
};

class AgreeOverFabric : public ::testing::TestWithParam<const char*> {};

TEST_P(AgreeOverFabric, EveryAgreementArrivesExactlyBySignalMessage) {
  FabricOptions o;
  o.provider = GetParam();
  o.domain = o.provider == "shm" ? "" : "lo";
  o.signal_value = SignalValuePath::kMessage;
  o.completion_timeout_ms = 10000;
  auto a = open_fabric(o);
  if (!a.ok() && a.status().code() == StatusCode::kNotFound) GTEST_SKIP() << a.status().to_string();
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = open_fabric(o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Endpoints e{std::move(a).value(), std::move(b).value()};
  auto addr_a = e.a->local_address();
  auto addr_b = e.b->local_address();
  ASSERT_TRUE(addr_a.ok() && addr_b.ok());
  auto pa = e.a->add_peer(addr_b.value());
  auto pb = e.b->add_peer(addr_a.value());
  ASSERT_TRUE(pa.ok() && pb.ok());
  e.b_at_a = pa.value();
  std::mt19937_64 rng(20261206);
  std::map<uint32_t, uint64_t> flag;
  std::vector<Completion> done;
  std::vector<Arrival> arrivals;
  uint64_t cookie = 0, completed = 0, wrong = 0;
  size_t got = 0;
  std::map<uint32_t, uint64_t> expected;
  // Both sides make progress (manual progress: a sender's message may wait on its receiver).
  auto pump = [&] {
    done.clear();
    (void)e.a->poll(&done, nullptr);
    for (const Completion& c : done) EXPECT_TRUE(c.status.ok()) << c.status.to_string();
    completed += done.size();
    arrivals.clear();
    (void)e.b->poll(nullptr, &arrivals);
    for (const Arrival& x : arrivals) {
      ++got;
      wrong += x.signal_value != expected[x.signal_idx];
      flag[x.signal_idx] = std::max(flag[x.signal_idx], x.signal_value);
    }
  };
  for (uint64_t seq = 0; seq < 600; ++seq) {
    const uint32_t bank = static_cast<uint32_t>(seq % mk::kAgreeBanks);
    got = 0;
    for (uint32_t i = 0; i < mk::kAgreeWords; ++i) {
      const uint32_t word = rng() % 4 == 0 ? (rng() % 2 ? 0u : 0xFFFFFFFFu) : static_cast<uint32_t>(rng());
      const uint32_t idx = bank * mk::kAgreeWords + i;
      ASSERT_LT(flag[idx], mk::agree_flag_floor(seq)) << "seq " << seq;
      WriteOp op;
      op.cookie = ++cookie;
      op.peer = e.b_at_a;
      op.has_signal = true;
      op.signal_idx = idx;
      op.signal_value = mk::agree_flag_value(seq, word);
      expected[idx] = op.signal_value;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (Status st = e.a->post_write(op); !st.ok(); st = e.a->post_write(op)) {
        ASSERT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << st.to_string() << " seq " << seq;
        pump();
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got < mk::kAgreeWords && std::chrono::steady_clock::now() < deadline) pump();
    ASSERT_EQ(got, mk::kAgreeWords) << "agreement " << seq << ": " << got << " words arrived";
    for (uint32_t i = 0; i < mk::kAgreeWords; ++i) {
      const uint32_t idx = bank * mk::kAgreeWords + i;
      ASSERT_EQ(flag[idx], expected[idx]) << "seq " << seq << " flag " << idx;
      ASSERT_GE(flag[idx], mk::agree_flag_floor(seq));
    }
  }
  EXPECT_EQ(wrong, 0u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (completed < cookie && std::chrono::steady_clock::now() < deadline) pump();
  EXPECT_EQ(completed, cookie);
}

INSTANTIATE_TEST_SUITE_P(Providers, AgreeOverFabric, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param) == "shm" ? std::string("shm") : std::string("tcp");
                         });

}  // namespace
}  // namespace mkernel::daemon::net
