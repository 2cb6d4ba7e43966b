// mkernel-ring-demo: the command ring end to end on the host. Producer threads stand in for GPU
// blocks and push commands; one consumer thread (what a proxy runs) takes, validates and counts
// them. One producer also writes a few hostile records, which are rejected with their reason.
// Exits non-zero if any record is lost, duplicated or misjudged.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/version.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

struct Options {
  uint32_t producers = 8;
  uint64_t records = 200000;  // per producer
  uint32_t capacity_log2 = 12;
  uint32_t hostile = 5;       // hostile records mixed in by producer 0
};

bool parse_u64(const char* s, uint64_t* out) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0') return false;
  *out = v;
  return true;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "mkernel-ring-demo: %s\n"
               "usage: mkernel-ring-demo [--producers N (1..64)] [--records N per producer]\n"
               "                         [--capacity-log2 N (1..20)] [--hostile N]\n",
               why);
  return 2;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    uint64_t v = 0;
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    if (!parse_u64(argv[i + 1], &v))
      return usage((a + ": value \"" + argv[i + 1] + "\" is not a whole number").c_str());
    ++i;
    if (a == "--producers") {
      if (v < 1 || v > 64) return usage(("--producers: " + std::to_string(v) + "; expected 1..64").c_str());
      opt.producers = static_cast<uint32_t>(v);
    } else if (a == "--records") {
      if (v < 1) return usage("--records: 0; expected at least 1");
      opt.records = v;
    } else if (a == "--capacity-log2") {
      if (!mp::valid_capacity_log2(static_cast<uint32_t>(v)) || v > 20)
        return usage(("--capacity-log2: " + std::to_string(v) + "; expected 1..20").c_str());
      opt.capacity_log2 = static_cast<uint32_t>(v);
    } else if (a == "--hostile") {
      opt.hostile = static_cast<uint32_t>(v);
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }

  const size_t bytes = mp::ring_segment_bytes(opt.capacity_log2);
  std::unique_ptr<void, FreeDeleter> mem(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  mp::RingView view;
  if (std::string err = mp::init_ring(mem.get(), bytes, opt.capacity_log2, 1, 1, &view);
      !err.empty()) {
    std::fprintf(stderr, "mkernel-ring-demo: %s\n", err.c_str());
    return 1;
  }
  mp::DecodeLimits lim;
  lim.num_ranks = 8;
  lim.num_regions = 4;
  lim.num_signals = 1024;
  lim.max_bytes = 1 << 20;

  std::printf("mkernel command ring demo (protocol v%u): %u producer threads x %llu records, "
              "ring of %llu slots of %zu bytes\n",
              mp::kProtocolVersion, opt.producers, static_cast<unsigned long long>(opt.records),
              static_cast<unsigned long long>(view.capacity()), sizeof(mp::CommandRecord));

  std::atomic<uint32_t> producer_failures{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t p = 0; p < opt.producers; ++p) {
    threads.emplace_back([&, p] {
      mp::HostRingProducer producer(view, 1);
      for (uint64_t i = 0; i < opt.records; ++i) {
        const uint64_t tag = (uint64_t{p} << 40) | i;
        const mp::Command c = mp::make_write_signal(
            static_cast<uint32_t>(i % 8), 0, (i % 256) * 4096, 1, (i % 256) * 4096, 4096,
            static_cast<uint32_t>(p), i + 1, tag);
        if (producer.push(c, 5s) != mp::kRingOk) {
          ++producer_failures;
          return;
        }
        // Producer 0 slips hostile records in: a rank outside the communicator, a region that
        // does not exist, a wrapping offset.
        if (p == 0 && i < opt.hostile) {
          mp::Command bad = mp::make_write(0, 0, 0, 0, 0, 64, ~uint64_t{0});
          if (i % 3 == 0) bad.dst_rank = 1000;
          if (i % 3 == 1) bad.dst_region = 3000;
          if (i % 3 == 2) bad.dst_offset = ~uint64_t{0} - 8;
          if (producer.push(bad, 5s) != mp::kRingOk) ++producer_failures;
        }
      }
    });
  }

  const uint64_t expected_good = uint64_t{opt.producers} * opt.records;
  const uint64_t expected_bad = std::min<uint64_t>(opt.hostile, opt.records);
  std::vector<std::vector<uint8_t>> seen(opt.producers, std::vector<uint8_t>(opt.records, 0));
  uint64_t duplicates = 0, misjudged = 0;
  mp::RingConsumer consumer(view, {.limits = lim, .tail_batch = 64});
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (consumer.stats().consumed < expected_good + expected_bad &&
         std::chrono::steady_clock::now() < deadline && producer_failures == 0) {
    const size_t n = consumer.poll(
        1024,
        [&](const mp::Command& c, uint64_t) {
          const uint64_t p = c.tag >> 40, i = c.tag & ((uint64_t{1} << 40) - 1);
          if (p >= opt.producers || i >= opt.records) {
            ++misjudged;
            return;
          }
          if (seen[p][i]++ != 0) ++duplicates;
          consumer.add_completed(1);
        },
        [&](const mp::CommandRecord& r, mp::RejectReason why, uint64_t pos) {
          if (r.tag != ~uint64_t{0}) ++misjudged;
          if (consumer.stats().rejected <= 3)
            std::printf("  rejected record at position %llu: %s\n",
                        static_cast<unsigned long long>(pos), mp::reject_reason_name(why));
          consumer.add_completed(1);
        });
    if (n == 0) std::this_thread::yield();
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  uint64_t missing = 0;
  for (auto& v : seen)
    for (uint8_t s : v) missing += s == 0;
  const mp::ConsumerStats& st = consumer.stats();
  std::printf("\n%-28s %14s\n", "", "value");
  std::printf("%-28s %14llu\n", "records consumed", static_cast<unsigned long long>(st.consumed));
  std::printf("%-28s %14llu\n", "accepted", static_cast<unsigned long long>(st.accepted));
  std::printf("%-28s %14llu\n", "rejected", static_cast<unsigned long long>(st.rejected));
  std::printf("%-28s %14llu\n", "completed (ring counter)",
              static_cast<unsigned long long>(view.header->completed));
  std::printf("%-28s %14llu\n", "missing", static_cast<unsigned long long>(missing));
  std::printf("%-28s %14llu\n", "duplicated", static_cast<unsigned long long>(duplicates));
  std::printf("%-28s %14.2f\n", "million records / s", static_cast<double>(st.consumed) / secs / 1e6);
  const bool ok = producer_failures == 0 && missing == 0 && duplicates == 0 && misjudged == 0 &&
                  st.rejected == expected_bad && st.consumed == st.accepted + st.rejected &&
                  view.header->completed == st.consumed;
  std::printf("\n%s\n", ok ? "ring demo: every record consumed exactly once, hostile ones rejected"
                           : "ring demo: FAILED (see counts above)");
  return ok ? 0 : 1;
}
