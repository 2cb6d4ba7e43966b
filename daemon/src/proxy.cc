#include "proxy.h"

#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#if defined(__x86_64__)
#include <immintrin.h>
#define MK_PAUSE() _mm_pause()
#else
#define MK_PAUSE() ((void)0)
#endif

namespace mkernel::daemon {

namespace mp = mkernel::protocol;
using Clock = std::chrono::steady_clock;

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
}  // namespace

Proxy::Proxy(ProxyOptions options, std::unique_ptr<Transport> transport,
             std::function<void(uint64_t)> on_session_ended)
    : options_(std::move(options)),
      transport_(std::move(transport)),
      on_session_ended_(std::move(on_session_ended)),
      spin_(options_.spin),
      spin_for_us_(options_.spin_for.count()),
      sleep_for_us_(options_.sleep_for.count()),
      batch_(options_.batch) {
  peers_ = std::make_shared<const PeerTable>();
}

Proxy::~Proxy() { stop(); }

Status Proxy::start() {
  if (thread_.joinable()) return Status(StatusCode::kFailedPrecondition, "proxy already started");
  heartbeat_ns_.store(now_ns(), std::memory_order_relaxed);
  thread_ = std::thread([this] { run(); });
  // Name and pin from outside too, so both are in place even before the first poll.
  const std::string tname = "mkd-proxy" + std::to_string(options_.index);
  pthread_setname_np(thread_.native_handle(), tname.substr(0, 15).c_str());
  if (!options_.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (uint32_t c : options_.cpus) CPU_SET(c, &set);
    if (const int rc = pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set); rc != 0)
      spdlog::warn("proxy {}: cannot pin to the configured CPUs ({}); running unpinned",
                   options_.name, errno_status("pthread_setaffinity_np", rc).message());
  }
  return Status::Ok();
}

void Proxy::stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

void Proxy::add_session(std::shared_ptr<Session> s) {
  std::lock_guard<std::mutex> lock(mu_);
  to_add_.push_back(std::move(s));
  version_.fetch_add(1, std::memory_order_release);
}

void Proxy::remove_session(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  to_remove_.push_back(session_id);
  version_.fetch_add(1, std::memory_order_release);
}

void Proxy::set_peers(std::shared_ptr<const PeerTable> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  new_peers_ = std::move(peers);
  version_.fetch_add(1, std::memory_order_release);
}

void Proxy::set_polling(bool spin, std::chrono::microseconds spin_for,
                        std::chrono::microseconds sleep_for, uint32_t batch) {
  spin_.store(spin, std::memory_order_relaxed);
  spin_for_us_.store(spin_for.count(), std::memory_order_relaxed);
  sleep_for_us_.store(sleep_for.count(), std::memory_order_relaxed);
  batch_.store(std::max<uint32_t>(1, batch), std::memory_order_relaxed);
}

void Proxy::stall_for(std::chrono::milliseconds d) {
  stall_until_ns_.store(now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                        std::memory_order_release);
}

std::chrono::steady_clock::duration Proxy::since_heartbeat() const {
  return std::chrono::nanoseconds(now_ns() - heartbeat_ns_.load(std::memory_order_acquire));
}

ProxyStats Proxy::stats() const {
  ProxyStats s;
  s.gpu = options_.index;
  s.name = options_.name;
  s.transport = transport_->name();
  s.nic = transport_->nic();
  s.consumed = consumed_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kNumOutcomes; ++i) s.by_outcome[i] = by_outcome_[i].load(std::memory_order_relaxed);
  s.in_flight = 0;  // the loopback transport completes inline
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.ring_occupancy = occupancy_.load(std::memory_order_relaxed);
  s.ring_capacity = capacity_.load(std::memory_order_relaxed);
  s.sessions = num_sessions_.load(std::memory_order_relaxed);
  s.rings = num_rings_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kLatencyBuckets; ++i) s.latency_ns_log2[i] = latency_[i].load(std::memory_order_relaxed);
  s.seconds_since_heartbeat = std::chrono::duration<double>(since_heartbeat()).count();
  return s;
}

void Proxy::apply_changes() {
  std::vector<std::shared_ptr<Session>> add;
  std::vector<uint64_t> remove;
  std::shared_ptr<const PeerTable> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    add.swap(to_add_);
    remove.swap(to_remove_);
    peers = std::move(new_peers_);
    new_peers_.reset();
    seen_version_ = version_.load(std::memory_order_acquire);
  }
  // Additions first: a session added and removed between two looks must end up removed.
  for (auto& s : add) sessions_.push_back(Tracked{std::move(s), {}, nullptr});
  for (uint64_t id : remove) {
    auto it = std::find_if(sessions_.begin(), sessions_.end(),
                           [id](const Tracked& t) { return t.session->id() == id; });
    if (it != sessions_.end()) {
      for (auto& c : it->consumers) c->publish_tail();
      sessions_.erase(it);
    }
  }
  if (peers) peers_ = std::move(peers);
  for (Tracked& t : sessions_) {
    auto it = peers_->find(t.session->identity().communicator);
    t.peers = it != peers_->end() ? it->second : nullptr;
  }
  num_sessions_.store(static_cast<uint32_t>(sessions_.size()), std::memory_order_relaxed);
}

void Proxy::refresh_consumers(Tracked& t) {
  const uint32_t n = t.session->num_rings();
  while (t.consumers.size() < n) {
    const SessionRing* r = t.session->ring(static_cast<uint32_t>(t.consumers.size()));
    mp::ConsumerOptions o;
    o.limits.num_ranks = t.session->identity().world_size;
    o.limits.num_regions = t.session->quota().max_regions;
    o.limits.num_signals = mp::kNoSignal;  // flag bounds are checked at the destination
    o.tail_batch = 32;
    t.consumers.push_back(std::make_unique<mp::RingConsumer>(r->view, o));
  }
}

void Proxy::end_session(Tracked& t, Status why, uint32_t code, uint32_t detail, uint64_t pos) {
  const uint64_t id = t.session->id();
  if (t.session->end(why, code, detail, pos)) {
    spdlog::warn("proxy {}: session {} ({}) ended: {}", options_.name, id, t.session->identity().name,
                 why.to_string());
    if (on_session_ended_) on_session_ended_(id);
  }
}

size_t Proxy::poll_session(Tracked& t) {
  Session& s = *t.session;
  if (s.ended()) return 0;
  refresh_consumers(t);
  const uint32_t batch = batch_.load(std::memory_order_relaxed);
  size_t taken = 0;
  // Counted locally and published once per poll: the command path takes no atomic per command.
  std::array<uint64_t, kNumOutcomes> outcomes{};
  std::array<uint64_t, kLatencyBuckets> latency{};
  uint64_t bytes = 0, errors = 0;
  for (size_t ri = 0; ri < t.consumers.size() && !s.ended(); ++ri) {
    mp::RingConsumer& c = *t.consumers[ri];
    uint64_t done = 0;
    // Latency of a command: from the end of the previous one (the moment this one was taken,
    // in a polling loop that does nothing else) to its completion. One clock read per command.
    int64_t mark = now_ns();
    auto stamp = [&] {
      const int64_t now = now_ns();
      ++latency[std::min<size_t>(kLatencyBuckets - 1, std::bit_width(static_cast<uint64_t>(now - mark)))];
      mark = now;
    };
    // Each callback returns whether to go on: nothing more is taken from a session once it ended.
    auto on_command = [&](const mp::Command& cmd, uint64_t pos) -> bool {
      ++done;
      mp::RejectReason reject = mp::kRejectNone;
      Status st;
      // Source checks: the region is this session's and the range lies inside it.
      if (cmd.op == mp::kOpWrite || cmd.op == mp::kOpWriteSignal) {
        const Region* src = s.region(cmd.src_region);
        if (src == nullptr) reject = mp::kRejectBadRegion;
        else if (cmd.src_offset > src->bytes || cmd.num_bytes > src->bytes - cmd.src_offset)
          reject = mp::kRejectBadOffset;
      }
      if (reject == mp::kRejectNone) {
        static const PeerList kNoPeers;
        st = transport_->execute(s, t.peers ? *t.peers : kNoPeers, cmd, &reject);
      }
      stamp();
      if (reject != mp::kRejectNone) {
        ++outcomes[static_cast<size_t>(Outcome::kRejected)];
        end_session(t,
                    Status(StatusCode::kInvalidArgument,
                           std::string("command at ring ") + std::to_string(ri) + " position " +
                               std::to_string(pos) + " rejected: " + mp::reject_reason_name(reject)),
                    kRingErrRejected, reject, pos);
      } else if (!st.ok()) {
        ++outcomes[static_cast<size_t>(Outcome::kError)];
        ++errors;
        end_session(t, st.with_context("command at position " + std::to_string(pos)),
                    kRingErrTransport, static_cast<uint32_t>(st.code()), pos);
      } else {
        ++outcomes[static_cast<size_t>(Outcome::kOk)];
        if (cmd.op == mp::kOpWrite || cmd.op == mp::kOpWriteSignal) bytes += cmd.num_bytes;
      }
      return !s.ended();
    };
    auto on_reject = [&](const mp::CommandRecord&, mp::RejectReason why, uint64_t pos) -> bool {
      ++done;
      stamp();
      ++outcomes[static_cast<size_t>(Outcome::kRejected)];
      end_session(t,
                  Status(StatusCode::kInvalidArgument,
                         std::string("record at ring ") + std::to_string(ri) + " position " +
                             std::to_string(pos) + " rejected: " + mp::reject_reason_name(why)),
                  kRingErrRejected, why, pos);
      return false;
    };
    const size_t n = c.poll(batch, on_command, on_reject);
    if (n) {
      c.add_completed(done);
      taken += n;
    }
  }
  if (taken) {
    // Outcomes first, then consumed: a reader that sees `consumed` sees its outcomes too.
    for (size_t i = 0; i < kNumOutcomes; ++i)
      if (outcomes[i]) by_outcome_[i].fetch_add(outcomes[i], std::memory_order_relaxed);
    for (size_t i = 0; i < kLatencyBuckets; ++i)
      if (latency[i]) latency_[i].fetch_add(latency[i], std::memory_order_relaxed);
    if (bytes) bytes_.fetch_add(bytes, std::memory_order_relaxed);
    if (errors) errors_.fetch_add(errors, std::memory_order_relaxed);
    s.commands.fetch_add(taken, std::memory_order_relaxed);
    consumed_.fetch_add(taken, std::memory_order_release);
  }
  return taken;
}

void Proxy::publish_occupancy() {
  uint64_t occ = 0, cap = 0, rings = 0;
  for (Tracked& t : sessions_) {
    if (t.session->ended()) continue;
    for (auto& c : t.consumers) {
      occ += c->occupancy();
      cap += c->view().capacity();
      ++rings;
      // A producer that gave up on a slot leaves a hole the ring cannot get past: say why.
      uint32_t detail = 0;
      uint64_t pos = 0;
      if (const uint32_t code = c->client_error(&detail, &pos); code != 0) {
        end_session(t,
                    Status(StatusCode::kFailedPrecondition,
                           std::string("producer abandoned ring position ") + std::to_string(pos) +
                               ": " + mp::ring_status_name(code)),
                    kRingErrSessionEnded, static_cast<uint32_t>(StatusCode::kFailedPrecondition), pos);
        break;
      }
    }
  }
  occupancy_.store(occ, std::memory_order_relaxed);
  capacity_.store(cap, std::memory_order_relaxed);
  num_rings_.store(static_cast<uint32_t>(rings), std::memory_order_relaxed);
}

void Proxy::run() {
  started_.store(true, std::memory_order_release);
  int64_t last_work = now_ns();
  int64_t last_publish = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    int64_t now = now_ns();
    const int64_t stall_until = stall_until_ns_.load(std::memory_order_acquire);
    if (stall_until > now) {  // test hook: a proxy that stopped checking in
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    heartbeat_ns_.store(now, std::memory_order_release);
    if (version_.load(std::memory_order_acquire) != seen_version_) apply_changes();
    size_t work = 0;
    for (Tracked& t : sessions_) work += poll_session(t);
    if (now - last_publish > 1'000'000) {
      publish_occupancy();
      last_publish = now;
    }
    if (work) {
      last_work = now;
      continue;
    }
    if (spin_.load(std::memory_order_relaxed) ||
        now - last_work < spin_for_us_.load(std::memory_order_relaxed) * 1000) {
      MK_PAUSE();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_for_us_.load(std::memory_order_relaxed)));
    }
  }
  // Leave the tails published for anyone still looking.
  for (Tracked& t : sessions_)
    for (auto& c : t.consumers) c->publish_tail();
  sessions_.clear();
}

}  // namespace mkernel::daemon
