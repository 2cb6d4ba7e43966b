// mkernel-cluster-client: one rank of an all-to-all exchange through mkerneld across nodes,
// every byte and flag checked. The multi-node integration tests (cluster_test.cc) start one per
// node; it can be run by hand against daemons on real machines the same way.
//
// Design notes
//  1. Memory: a source region of `world` slices (slice r holds what goes to rank r), a
//     remote-writable destination region of `world` slots (slot s receives from rank s), each
//     slice and slot max_bytes + 64 bytes. Flags: [0, world) data from rank s, [world, 2*world)
//     acknowledgements from rank r, [2*world, 3*world) "finished" from rank s.
//  2. Everything a receiver needs to check a message is derived from (seed, src, dst, iteration)
//     by a hash, so nothing but the data and the flag travels: the size (log-uniform in
//     4..max_bytes, odd sizes included, every fourth iteration within 2 bytes of max_bytes), the
//     destination offset inside the slot (0..63, so copies are unaligned) and every byte.
//  3. Per pair and iteration i: the sender writes the message into rank r's slot for it with
//     data flag = sender's rank, value i (write_signal); the receiver waits for that flag to reach
//     i, checks that it is exactly i and every byte, and acknowledges with
//     signal(sender, world + me, i). The sender sends i+1 to r only after r's ack reached i (the
//     slot is free again) and after the ring's `completed` passed the position of its previous
//     write to r (the source slice is free again).
//  4. The end is a barrier: every rank signals "finished" (flag 2*world + me) to every other
//     rank once it got all data and all acks, then waits for everyone's "finished" and for its
//     own ring to complete everything. So no rank leaves while a command to or from it is
//     outstanding.
//  5. Every wait is bounded by --timeout-ms of no progress, and checks the ring's error word and
//     the session (check_alive) while it waits, so a session the daemon ended is reported at
//     once with the daemon's reason.
//  6. Exit status: 0 everything arrived exact; 1 any wrong byte or flag (even if an error
//     followed); 2 an error (session ended, timeout, setup). One JSON line on stdout says why.
//  7. --hostile MODE (isolation tests): rank 0 sends one invalid command to rank 1 (bad-region:
//     a destination region id rank 1 never registered; bad-range: a range running 32 bytes past
//     the end of rank 1's destination region) and exits 0 when the daemon rejected it as it
//     must (ring error word kRingErrRejected and the session ended), 1 otherwise. The other
//     ranks only stay connected for --linger-ms and exit 0 when their own session survived.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_client.h"
#include "splitmix.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using mkernel::protocol::kRingErrRejected;  // the ring error word's codes (protocol/status.h)

constexpr uint64_t kSlotPad = 64;

struct Args {
  std::string socket;
  std::string communicator = "cluster";
  uint32_t rank = 0;
  uint32_t world = 2;
  std::string root;
  std::string token;
  uint32_t iterations = 10;
  uint64_t max_bytes = 4 << 20;
  uint64_t seed = 1;
  std::string provider_note;
  uint32_t timeout_ms = 30000;
  bool json = false;
  uint32_t pace_ms = 0;
  std::string hostile;
  uint32_t linger_ms = 3000;
};

struct Report {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t bytes_checked = 0;
  uint64_t wrong_bytes = 0;
  uint64_t wrong_flags = 0;
  uint32_t ring_error = 0;
  uint32_t ring_error_detail = 0;
  bool session_ended = false;  // the daemon ended the session (or closed its socket)
  // Ended in an error: commands pushed but not completed (on a timeout waiting for one peer,
  // whether the last command to that peer was still in flight).
  uint64_t in_flight = 0;
  std::string error;
  std::string transport;
};

using mkernel_itest::mix;

uint64_t message_key(uint64_t seed, uint32_t src, uint32_t dst, uint64_t iteration) {
  return mix(mix(mix(mix(seed) ^ src) ^ (uint64_t{dst} << 24)) ^ iteration);
}

uint64_t message_size(uint64_t key, uint64_t iteration, uint64_t max_bytes) {
  if (iteration % 4 == 2) return max_bytes - (key % 3);  // the largest sizes, odd ones among them
  const double u = static_cast<double>(mix(key ^ 0x5157) >> 11) * 0x1.0p-53;
  const double lo = std::log(4.0), hi = std::log(static_cast<double>(max_bytes));
  const auto s = static_cast<uint64_t>(std::exp(lo + u * (hi - lo)));
  return std::clamp<uint64_t>(s, 4, max_bytes);
}

uint64_t dst_shift(uint64_t key) { return (key >> 20) % kSlotPad; }
uint64_t src_shift(uint64_t key) { return (key >> 26) % kSlotPad; }

void fill_pattern(uint8_t* p, uint64_t n, uint64_t key) {
  uint64_t w = 0;
  for (; (w + 1) * 8 <= n; ++w) {
    const uint64_t v = mix(key + w);
    std::memcpy(p + w * 8, &v, 8);
  }
  if (w * 8 < n) {
    const uint64_t v = mix(key + w);
    std::memcpy(p + w * 8, &v, n - w * 8);
  }
}

// Wrong bytes of `p` against the pattern.
uint64_t check_pattern(const uint8_t* p, uint64_t n, uint64_t key) {
  uint64_t wrong = 0;
  for (uint64_t w = 0; w * 8 < n; ++w) {
    const uint64_t v = mix(key + w);
    const uint64_t len = std::min<uint64_t>(8, n - w * 8);
    if (std::memcmp(p + w * 8, &v, len) == 0) continue;
    const auto* e = reinterpret_cast<const uint8_t*>(&v);
    for (uint64_t b = 0; b < len; ++b) wrong += p[w * 8 + b] != e[b];
  }
  return wrong;
}

uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(x)).load(std::memory_order_acquire);
}
uint32_t load_acquire32(const uint32_t& x) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(x)).load(std::memory_order_acquire);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

class Rank {
 public:
  explicit Rank(const Args& a) : a_(a) {}

  // Runs the whole exchange; fills report_.
  void run();
  const Report& report() const { return report_; }

 private:
  bool setup();
  void exchange();
  void hostile();
  // Pushes one command (bounded); false (and report_.error) on failure.
  bool push(const mp::Command& c, uint64_t* pos = nullptr);
  // The daemon's verdict on this session: "" while alive, else the ring error and/or reason.
  std::string session_problem(bool wait_for_reason);
  uint64_t completed() const { return load_acquire(ring_->view.header->completed); }
  uint64_t flag(uint32_t idx) const { return load_acquire(flags_->flags()[idx]); }

  const Args& a_;
  Report report_;
  std::unique_ptr<mp::SessionClient> client_;
  mp::ClientRing* ring_ = nullptr;
  mp::ClientRegion* src_ = nullptr;
  mp::ClientRegion* dst_ = nullptr;
  mp::ClientFlags* flags_ = nullptr;
  std::unique_ptr<mp::HostRingProducer> producer_;
  mp::ConnectInfo info_;
  uint64_t slot_ = 0;
  uint64_t pushed_ = 0;
  Clock::time_point last_alive_check_{};
};

bool Rank::setup() {
  mp::SessionClient::Options o;
  o.socket_path = a_.socket;
  o.client_name = "cluster-" + a_.communicator + "-r" + std::to_string(a_.rank);
  o.communicator = a_.communicator;
  o.rank = a_.rank;
  o.world_size = a_.world;
  o.timeout = std::chrono::milliseconds(std::min<uint32_t>(a_.timeout_ms, 10000));
  auto c = mp::SessionClient::connect(o);
  if (!c.ok()) {
    report_.error = "connect to " + a_.socket + ": " + c.status().to_string();
    return false;
  }
  client_ = std::move(c.value());
  const uint32_t log2 = std::min<uint32_t>(10, client_->limits().max_ring_capacity_log2);
  slot_ = (a_.max_bytes + kSlotPad + 63) / 64 * 64;
  auto r = client_->create_ring(log2);
  auto s = r.ok() ? client_->create_region(slot_ * a_.world, false) : r.status();
  auto d = s.ok() ? client_->create_region(slot_ * a_.world, true) : s.status();
  auto f = d.ok() ? client_->create_flags(3 * a_.world) : d.status();
  if (!f.ok()) {
    report_.error = "setup (ring, regions, flags): " + f.status().to_string();
    return false;
  }
  ring_ = r.value();
  src_ = s.value();
  dst_ = d.value();
  flags_ = f.value();
  producer_ = std::make_unique<mp::HostRingProducer>(ring_->view, client_->epoch());
  std::string root = a_.root;
  if (root.empty() && a_.rank == 0) root = client_->peer_address();
  std::string token = a_.token.empty() ? "mkernel-cluster-client-token:" + a_.communicator : a_.token;
  const auto t0 = Clock::now();
  auto ci = client_->connect_communicator({root, token, std::chrono::milliseconds(a_.timeout_ms), false});
  if (!ci.ok()) {
    report_.error = "connect_communicator (root " + root + "): " + ci.status().to_string();
    return false;
  }
  info_ = ci.value();
  report_.transport = info_.transport;
  std::string routes;
  for (const auto& rr : info_.ranks)
    routes += " " + std::to_string(rr.rank) + "@" + rr.node + (rr.network ? "/net" : "/local");
  std::fprintf(stderr, "rank %u: connected communicator %s in %.0f ms: transport %s, ranks%s\n", a_.rank,
               a_.communicator.c_str(),
               std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
               info_.transport.c_str(), routes.c_str());
  std::fflush(stderr);
  if (info_.ranks.size() != a_.world) {
    report_.error = "connect_communicator returned " + std::to_string(info_.ranks.size()) +
                    " ranks; expected " + std::to_string(a_.world);
    return false;
  }
  return true;
}

std::string Rank::session_problem(bool wait_for_reason) {
  std::string out;
  const uint32_t err = load_acquire32(ring_->view.header->error);
  if (err != 0) {
    report_.ring_error = err;
    report_.ring_error_detail = ring_->view.header->error_detail;
    out = "ring error word " + std::to_string(err) + " (detail " + std::to_string(ring_->view.header->error_detail) +
          ", position " + std::to_string(ring_->view.header->error_pos) + ")";
  }
  // The daemon writes the ring error word before it sends SessionEnded: give the message a
  // moment to arrive when the word is already set.
  const auto wait = wait_for_reason || err != 0 ? 1000ms : 0ms;
  if (const mkernel::Status s = client_->check_alive(wait); !s.ok()) {
    report_.session_ended = true;
    out += (out.empty() ? "" : "; ") + s.to_string();
  }
  return out;
}

bool Rank::push(const mp::Command& c, uint64_t* pos) {
  const mp::RingStatus s = producer_->push(c, std::chrono::milliseconds(a_.timeout_ms), pos);
  if (s == mp::kRingOk) {
    ++pushed_;
    return true;
  }
  report_.error = std::string("push: ") + mp::ring_status_name(s);
  if (std::string p = session_problem(true); !p.empty()) report_.error += ": " + p;
  return false;
}

void Rank::exchange() {
  const uint32_t me = a_.rank, world = a_.world;
  const uint64_t n = a_.iterations;
  auto* src = static_cast<uint8_t*>(src_->data());
  const auto* dst = static_cast<const uint8_t*>(dst_->data());
  // Per peer: the next iteration to send and to receive, the ring position of the last write to
  // it, the last ack seen, and when anything last happened with it (the per-peer wait bound: a
  // peer that stops answering is reported even while the others keep going).
  std::vector<uint64_t> next_send(world, 1), next_recv(world, 1), last_pos(world, 0), seen_ack(world, 0);
  std::vector<bool> have_last(world, false);
  // The ring position of the last command of any kind (data or ack) to each peer.
  std::vector<uint64_t> last_cmd_pos(world, 0);
  std::vector<bool> have_cmd(world, false);
  const auto start = Clock::now();
  std::vector<Clock::time_point> next_send_time(world, start), heard(world, start);
  next_send[me] = next_recv[me] = n + 1;
  seen_ack[me] = n;
  auto last_progress = start;
  bool finished_sent = false;
  const auto bound = std::chrono::milliseconds(a_.timeout_ms);

  auto describe_peer = [&](uint32_t r) {
    return "rank " + std::to_string(r) + ": data iteration " + std::to_string(next_recv[r]) + " of " +
           std::to_string(n) + " (flag " + std::to_string(r) + " is " + std::to_string(flag(r)) + "), ack " +
           std::to_string(seen_ack[r]) + " of " + std::to_string(next_send[r] - 1) + " sent (flag " +
           std::to_string(world + r) + "), ring completed " + std::to_string(completed()) + " of " +
           std::to_string(pushed_) + " pushed";
  };

  for (;;) {
    bool progress = false;
    const auto now = Clock::now();
    // Receive: data from s, iteration next_recv[s].
    for (uint32_t s = 0; s < world; ++s) {
      const uint64_t i = next_recv[s];
      if (i > n) continue;
      const uint64_t v = flag(s);
      if (v < i) continue;
      if (v != i) ++report_.wrong_flags;  // the sender may not run ahead of our ack
      const uint64_t key = message_key(a_.seed, s, me, i);
      const uint64_t size = message_size(key, i, a_.max_bytes);
      report_.wrong_bytes += check_pattern(dst + s * slot_ + dst_shift(key), size, key);
      report_.bytes_checked += size;
      ++report_.received;
      uint64_t ack_pos = 0;
      if (!push(mp::make_signal(s, world + me, i), &ack_pos)) return;
      last_cmd_pos[s] = ack_pos;
      have_cmd[s] = true;
      next_recv[s] = i + 1;
      heard[s] = now;
      progress = true;
    }
    // Send: iteration next_send[r] to r once r acknowledged the previous one and our ring
    // finished the previous write to r (its source slice is free).
    for (uint32_t r = 0; r < world; ++r) {
      if (r == me) continue;
      const uint64_t acked = flag(world + r);
      if (acked != seen_ack[r]) {
        if (acked < seen_ack[r] || acked > next_send[r] - 1) ++report_.wrong_flags;  // never sent that
        seen_ack[r] = acked;
        heard[r] = now;
        progress = true;
      }
      const uint64_t i = next_send[r];
      if (i > n || now < next_send_time[r] || acked != i - 1) continue;
      if (have_last[r] && completed() <= last_pos[r]) continue;
      const uint64_t key = message_key(a_.seed, me, r, i);
      const uint64_t size = message_size(key, i, a_.max_bytes);
      const uint64_t src_off = r * slot_ + src_shift(key);
      fill_pattern(src + src_off, size, key);
      uint64_t pos = 0;
      if (!push(mp::make_write_signal(r, static_cast<uint16_t>(src_->id), src_off,
                                      static_cast<uint16_t>(dst_->id), me * slot_ + dst_shift(key), size, me, i,
                                      i),
                &pos))
        return;
      last_pos[r] = last_cmd_pos[r] = pos;
      have_last[r] = have_cmd[r] = true;
      ++report_.sent;
      next_send[r] = i + 1;
      next_send_time[r] = now + std::chrono::milliseconds(a_.pace_ms);
      heard[r] = now;
      progress = true;
    }
    // Done with the exchange: every message received and every one of ours acknowledged.
    bool all_in = true;
    for (uint32_t r = 0; r < world; ++r)
      all_in = all_in && next_recv[r] > n && next_send[r] > n && seen_ack[r] >= n;
    if (all_in && !finished_sent) {
      for (uint32_t r = 0; r < world; ++r) {
        if (r == me) continue;
        if (flag(world + r) != n) ++report_.wrong_flags;
        if (!push(mp::make_signal(r, 2 * world + me, 1))) return;
      }
      finished_sent = true;
      progress = true;
    }
    std::string barrier_wait;
    if (finished_sent) {
      if (completed() < pushed_)
        barrier_wait = "our ring to complete (" + std::to_string(completed()) + " of " + std::to_string(pushed_) + ")";
      for (uint32_t r = 0; r < world && barrier_wait.empty(); ++r)
        if (r != me && flag(2 * world + r) < 1)
          barrier_wait = "rank " + std::to_string(r) + " to finish (flag " + std::to_string(2 * world + r) + ")";
      if (barrier_wait.empty()) return;
    }
    if (progress) {
      last_progress = now;
      continue;
    }
    // Waiting: the daemon's verdict is reported at once, and every wait is bounded.
    if (load_acquire32(ring_->view.header->error) != 0 || now - last_alive_check_ > 5ms) {
      last_alive_check_ = now;
      if (std::string p = session_problem(false); !p.empty()) {
        std::string state;
        for (uint32_t r = 0; r < world; ++r)
          if (r != me) state += "; " + describe_peer(r);
        report_.error = "session ended: " + p + state;
        report_.in_flight = pushed_ - completed();
        return;
      }
    }
    std::string timed_out;
    uint32_t stuck = world;  // the peer a timeout waited for, when it was one
    if (finished_sent) {
      if (now - last_progress > bound) timed_out = "waiting for " + barrier_wait;
    } else {
      for (uint32_t r = 0; r < world && timed_out.empty(); ++r) {
        const bool pending = next_recv[r] <= n || next_send[r] <= n || seen_ack[r] < n;
        if (pending && now - heard[r] > bound) {
          timed_out = "nothing from or to " + describe_peer(r);
          stuck = r;
        }
      }
    }
    if (!timed_out.empty()) {
      report_.error = "timeout: " + std::to_string(a_.timeout_ms) + " ms with " + timed_out;
      // Commands to the peer waited for still in flight (0 or 1: the ring completes in order).
      report_.in_flight = stuck < world && have_cmd[stuck] && completed() <= last_cmd_pos[stuck] ? 1 : 0;
      if (std::string p = session_problem(false); !p.empty()) report_.error += "; " + p;
      return;
    }
    std::this_thread::sleep_for(20us);
  }
}

void Rank::hostile() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(a_.rank == 0 ? a_.timeout_ms : a_.linger_ms);
  if (a_.rank != 0) {
    // A bystander: its own session must survive what rank 0 does.
    while (Clock::now() < deadline) {
      if (const mkernel::Status s = client_->check_alive(20ms); !s.ok()) {
        report_.error = "bystander's session ended: " + s.to_string();
        return;
      }
    }
    return;
  }
  const uint32_t target = 1;
  mp::Command c;
  if (a_.hostile == "bad-region") {
    // Region ids are dense per session (0..regions-1): this one was never registered.
    const auto never = static_cast<uint16_t>(info_.ranks[target].regions);
    c = mp::make_write_signal(target, static_cast<uint16_t>(src_->id), 0, never, 0, 64, 0, 1, 0xBAD);
  } else {
    // Our destination region has the same size as rank 1's (same arguments): 32 bytes past its end.
    c = mp::make_write_signal(target, static_cast<uint16_t>(src_->id), 0, static_cast<uint16_t>(dst_->id),
                              dst_->size() - 32, 64, 0, 1, 0xBAD);
  }
  if (!push(c)) return;
  ++report_.sent;
  while (load_acquire32(ring_->view.header->error) == 0 && completed() < 1 && Clock::now() < deadline)
    std::this_thread::sleep_for(100us);
  const std::string p = session_problem(true);
  report_.error = p.empty() ? "the invalid command completed and the session lives on" : p;
}

void Rank::run() {
  if (!setup()) return;
  if (!a_.hostile.empty()) {
    hostile();
    return;
  }
  exchange();
  if (report_.error.empty()) client_->close();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"mkernel-cluster-client: one rank of a checked all-to-all exchange through mkerneld"};
  app.add_option("--socket", a.socket, "the local daemon's client socket")->required();
  app.add_option("--communicator", a.communicator, "communicator id (the same on every rank)");
  app.add_option("--rank", a.rank, "this rank");
  app.add_option("--world", a.world, "number of ranks")->check(CLI::Range(2, 1024));
  app.add_option("--root", a.root, "rank 0's daemon peer address; rank 0 may leave it empty");
  app.add_option("--token", a.token, "communicator secret, 16..256 bytes (default: derived from the communicator)");
  app.add_option("--iterations", a.iterations, "rounds of the exchange")->check(CLI::Range(0, 1000000));
  app.add_option("--max-bytes", a.max_bytes, "largest message")->check(CLI::Range(uint64_t{4}, uint64_t{1} << 30));
  app.add_option("--seed", a.seed, "seed of sizes, offsets and data");
  app.add_option("--provider-note", a.provider_note, "free text copied into the report (which provider)");
  app.add_option("--timeout-ms", a.timeout_ms, "bound of every wait (no progress)")->check(CLI::Range(1, 3600000));
  app.add_flag("--json", a.json, "print the report as one JSON line");
  app.add_option("--pace-ms", a.pace_ms, "at least this long between two sends to one rank (spreads the exchange out in time)");
  app.add_option("--hostile", a.hostile, "send one invalid command instead (isolation tests)")
      ->check(CLI::IsMember({"bad-region", "bad-range"}));
  app.add_option("--linger-ms", a.linger_ms, "with --hostile: how long the other ranks stay connected");
  CLI11_PARSE(app, argc, argv);
  if (a.rank >= a.world) {
    std::fprintf(stderr, "--rank: %u; expected 0..%u (--world %u)\n", a.rank, a.world - 1, a.world);
    return 2;
  }

  const auto t0 = Clock::now();
  Rank rank(a);
  rank.run();
  const Report& r = rank.report();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  int rc = 0;
  if (!a.hostile.empty()) {
    // Rank 0: the expected rejection is success. Bystanders: surviving is success.
    if (a.rank == 0) rc = r.ring_error == kRingErrRejected && r.session_ended ? 0 : 1;
    else rc = r.error.empty() ? 0 : 2;
  } else {
    rc = r.wrong_bytes || r.wrong_flags ? 1 : !r.error.empty() ? 2 : 0;
  }
  if (a.json) {
    std::printf("{\"rank\":%u,\"sent\":%llu,\"received\":%llu,\"bytes_checked\":%llu,\"wrong_bytes\":%llu,"
                "\"wrong_flags\":%llu,\"error\":\"%s\",\"elapsed_ms\":%.1f,\"ring_error\":%u,"
                "\"ring_error_detail\":%u,\"in_flight\":%llu,\"session_ended\":%s,\"transport\":\"%s\",\"provider_note\":\"%s\",\"exit\":%d}\n",
                a.rank, static_cast<unsigned long long>(r.sent), static_cast<unsigned long long>(r.received),
                static_cast<unsigned long long>(r.bytes_checked), static_cast<unsigned long long>(r.wrong_bytes),
                static_cast<unsigned long long>(r.wrong_flags), json_escape(r.error).c_str(), ms, r.ring_error,
                r.ring_error_detail, static_cast<unsigned long long>(r.in_flight), r.session_ended ? "true" : "false", json_escape(r.transport).c_str(), json_escape(a.provider_note).c_str(), rc);
  } else {
    std::printf("rank %u: sent %llu, received %llu, %llu bytes checked, %llu wrong bytes, %llu wrong flags, "
                "%.1f ms%s%s\n",
                a.rank, static_cast<unsigned long long>(r.sent), static_cast<unsigned long long>(r.received),
                static_cast<unsigned long long>(r.bytes_checked), static_cast<unsigned long long>(r.wrong_bytes),
                static_cast<unsigned long long>(r.wrong_flags), ms, r.error.empty() ? "" : ": error: ",
                r.error.c_str());
  }
  std::fflush(stdout);
  return rc;
}
