// What clients hold and the limits on it (ledger.h), refusals counted and logged without a
// flood (refusals.h), client-supplied text made safe to log (log_text.h).
#include <gtest/gtest.h>

#include <thread>

#include "ledger.h"
#include "log_text.h"
#include "refusals.h"

namespace md = mkernel::daemon;
using md::Holding;
using md::Ledger;
using md::LedgerLimits;
using md::Owner;
using md::Refusal;

namespace {

LedgerLimits small_limits() {
  LedgerLimits l;
  l.clients.max_per_gpu = 4;
  l.clients.max_sessions = 6;
  l.clients.max_shared_memory = 1000;
  l.clients.max_networks = 3;
  l.clients.per_uid = {4, 3, 10, 10, 600, 8, 2};
  l.clients.per_process = {2, 2, 5, 5, 400, 4, 1};
  l.descriptor_budget = 10;
  l.max_connects_per_uid = 2;
  return l;
}

// The refusal's reason and text when `ask` is refused, or "" when it is taken.
std::string refusal(Ledger& ledger, const Owner& o, const Holding& ask, const LedgerLimits& l,
                    Refusal* reason = nullptr) {
  auto d = ledger.take(o, ask, l);
  if (!d) return "";
  if (reason != nullptr) *reason = d->reason;
  return d->status.message();
}

}  // namespace

TEST(Ledger, ProcessThenUidThenNodeAndEachRefusalNamesItsLimit) {
  Ledger ledger;
  const LedgerLimits l = small_limits();
  const Owner p1{1000, 11}, p2{1000, 12}, p3{1000, 13}, other{2000, 21};
  const Holding session{.sessions = 1, .descriptors = 1};
  EXPECT_EQ(refusal(ledger, p1, session, l), "");
  EXPECT_EQ(refusal(ledger, p1, session, l), "");
  Refusal why{};
  EXPECT_EQ(refusal(ledger, p1, session, l, &why),
            "sessions: pid 11 already holds 2; at most 2 (clients.per_process.sessions)");
  EXPECT_EQ(why, Refusal::kProcessSessions);
  EXPECT_EQ(refusal(ledger, p2, session, l), "");
  EXPECT_EQ(refusal(ledger, p2, session, l), "");
  EXPECT_EQ(refusal(ledger, p3, session, l, &why),
            "sessions: uid 1000 already holds 4; at most 4 (clients.per_uid.sessions)");
  EXPECT_EQ(why, Refusal::kUidSessions);
  // Another user still finds room: one user cannot take the node's slots.
  EXPECT_EQ(refusal(ledger, other, session, l), "");
  EXPECT_EQ(ledger.node().sessions, 5u);
  // Bytes: the ask is named too.
  EXPECT_EQ(refusal(ledger, p1, Holding{.shared_memory = 500}, l, &why),
            "shared memory bytes: pid 11 already holds 0 and asks for 500 more; at most 400 "
            "(clients.per_process.shared_memory)");
  EXPECT_EQ(why, Refusal::kProcessSharedMemory);
  EXPECT_EQ(refusal(ledger, p1, Holding{.shared_memory = 300}, l), "");
  EXPECT_EQ(refusal(ledger, p2, Holding{.shared_memory = 301}, l, &why),
            "shared memory bytes: uid 1000 already holds 300 and asks for 301 more; at most 600 "
            "(clients.per_uid.shared_memory)");
  EXPECT_EQ(refusal(ledger, other, Holding{.shared_memory = 399}, l), "");
  EXPECT_EQ(refusal(ledger, Owner{3000, 31}, Holding{.shared_memory = 399}, l, &why),
            "shared memory bytes: the node already holds 699 and asks for 399 more; at most 1000 "
            "(clients.max_shared_memory)");
  EXPECT_EQ(why, Refusal::kMaxSharedMemory);
}

TEST(Ledger, DescriptorBudgetNamesWhyItIsLower) {
  Ledger ledger;
  LedgerLimits l = small_limits();
  l.clients.per_uid.descriptors = 100;
  l.clients.per_process.descriptors = 100;
  l.descriptor_budget = 3;
  l.descriptor_budget_why = ", lowered to 3 by the descriptor limit 4 less 1 kept for admin, health, metrics and peers";
  EXPECT_EQ(refusal(ledger, Owner{1, 1}, Holding{.descriptors = 3}, l), "");
  Refusal why{};
  EXPECT_EQ(refusal(ledger, Owner{2, 2}, Holding{.descriptors = 1}, l, &why),
            "descriptors: the node's clients already holds 3; at most 3 (clients.max_descriptors, lowered to 3 by "
            "the descriptor limit 4 less 1 kept for admin, health, metrics and peers)");
  EXPECT_EQ(why, Refusal::kMaxDescriptors);
}

TEST(Ledger, GpuSharesAndNetworksAndConnects) {
  Ledger ledger;
  const LedgerLimits l = small_limits();
  const Owner a{1000, 1}, b{1000, 2}, c{1000, 3}, d{2000, 4};
  EXPECT_FALSE(ledger.bind_gpu(a, 0, l));
  EXPECT_FALSE(ledger.bind_gpu(a, 0, l));
  auto refused = ledger.bind_gpu(a, 0, l);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status.message(),
            "sessions on gpu 0: pid 1 already holds 2; at most 2 (clients.per_process.sessions_per_gpu)");
  EXPECT_FALSE(ledger.bind_gpu(a, 1, l)) << "another GPU is another share";
  EXPECT_FALSE(ledger.bind_gpu(b, 0, l));
  refused = ledger.bind_gpu(c, 0, l);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->reason, Refusal::kUidSessionsPerGpu);
  EXPECT_FALSE(ledger.bind_gpu(d, 0, l));
  refused = ledger.bind_gpu(Owner{3000, 5}, 0, l);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status.message(), "sessions on gpu 0: the node already holds 4; at most 4 (clients.max_per_gpu)");
  EXPECT_EQ(ledger.sessions_on_gpu(0), 4u);
  ledger.unbind_gpu(d, 0);
  EXPECT_FALSE(ledger.bind_gpu(Owner{3000, 5}, 0, l));

  EXPECT_FALSE(ledger.take(a, Holding{.connects = 1, .networks = 1}, l));
  refused = ledger.take(a, Holding{.networks = 1}, l);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->reason, Refusal::kProcessNetworks);
  EXPECT_FALSE(ledger.take(b, Holding{.connects = 1}, l));
  refused = ledger.take(c, Holding{.connects = 1}, l);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status.message(), "connects in progress: uid 1000 already holds 2; at most 2 (connects_per_uid)");
}

TEST(Ledger, GivingBackRestoresEveryLevelAndForgetsIdleOwners) {
  Ledger ledger;
  const LedgerLimits l = small_limits();
  const Owner o{1000, 7};
  const Holding ask{.sessions = 1, .rings = 2, .regions = 3, .shared_memory = 100, .descriptors = 4};
  ASSERT_FALSE(ledger.take(o, ask, l));
  ASSERT_FALSE(ledger.bind_gpu(o, 2, l));
  EXPECT_EQ(ledger.of_uid(1000).rings, 2u);
  EXPECT_EQ(ledger.of_process(7).shared_memory, 100u);
  ledger.unbind_gpu(o, 2);
  ledger.give_back(o, ask);
  EXPECT_TRUE(ledger.node().empty());
  EXPECT_TRUE(ledger.of_uid(1000).empty());
  EXPECT_TRUE(ledger.of_process(7).empty());
  EXPECT_EQ(ledger.sessions_on_gpu(2), 0u);
  // A give-back larger than what was taken stops at zero instead of wrapping around.
  ledger.give_back(o, ask);
  EXPECT_TRUE(ledger.node().empty());
}

TEST(Refusals, CountedEveryTimeLoggedAFewTimesASecond) {
  md::Refusals r;
  for (int i = 0; i < 1000; ++i)
    r.record(Refusal::kMalformed, 42, 1000, mkernel::Status(mkernel::StatusCode::kProtocolError, "bad frame"));
  EXPECT_EQ(r.count(Refusal::kMalformed), 1000u);
  EXPECT_EQ(r.count(Refusal::kHelloRefused), 0u);
  const auto all = r.all();
  ASSERT_EQ(all.size(), md::kNumRefusals);
  EXPECT_EQ(all.front().first, "malformed");
  EXPECT_EQ(all.front().second, 1000u);
  EXPECT_EQ(all.back().first, "clients.per_process.networks");

  md::LogRateLimiter limiter(3);
  uint64_t left_out = 0;
  int allowed = 0;
  for (int i = 0; i < 100; ++i) allowed += limiter.allow(&left_out) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  ASSERT_TRUE(limiter.allow(&left_out));
  EXPECT_EQ(left_out, 97u) << "the next line says how many were left out";
  EXPECT_EQ(md::suppressed_note(97, "session lines"), " (and 97 more session lines not logged)");
  EXPECT_EQ(md::suppressed_note(0, "session lines"), "");
}

TEST(LogText, ClientTextCannotForgeLinesOrDrawOnTheTerminal) {
  const std::string nasty = std::string("evil\n[info] session 1: forged\x1b[2J\x1b]0;t\x07\r\t\"q\"\\") +
                            std::string(1, '\0') + "\xc3\xa9";
  const std::string safe = md::printable(nasty);
  EXPECT_EQ(safe, "evil\\n[info] session 1: forged\\x1b[2J\\x1b]0;t\\x07\\r\\t\\\"q\\\"\\\\\\x00\\xc3\\xa9");
  for (const char ch : safe) {
    const auto c = static_cast<unsigned char>(ch);
    EXPECT_TRUE(c >= 0x20 && c <= 0x7e) << "byte " << int(c);
  }
  EXPECT_EQ(md::quoted_printable("ok"), "\"ok\"");
  const std::string long_name(1000, 'x');
  EXPECT_EQ(md::printable(long_name, 8), "xxxxxxxx...(1000 bytes)");
}
