#include "proxy.h"

#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "log_text.h"

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

Proxy::Proxy(ProxyOptions options, std::function<void(uint64_t)> on_session_ended)
    : options_(std::move(options)),
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
  // Every proxy carries in-daemon commands on the loopback; `network` says what else it has.
  s.transport = options_.network.empty() ? "loopback" : "loopback+" + options_.network;
  s.nic = options_.nic.empty() ? kLoopbackNic : options_.nic;
  s.consumed = consumed_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < kNumOutcomes; ++i) s.by_outcome[i] = by_outcome_[i].load(std::memory_order_relaxed);
  s.in_flight = in_flight_.load(std::memory_order_relaxed);
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
  for (auto& s : add) {
    Tracked t;
    t.session = std::move(s);
    sessions_.push_back(std::move(t));
  }
  for (uint64_t id : remove) {
    auto it = std::find_if(sessions_.begin(), sessions_.end(),
                           [id](const Tracked& t) { return t.session->id() == id; });
    if (it != sessions_.end()) {
      if (!it->flushed) {  // what it still had taken is accounted before it goes
        Tally tally;
        flush_ended(*it, tally);
        publish(*it, tally, 0);
      }
      for (auto& r : it->rings) r.consumer->publish_tail();
      // The endpoint's table holds the communicator's sessions, this one included: let go of it
      // so the last holder frees the session.
      it->session->loopback().set_peers(nullptr);
      sessions_.erase(it);
    }
  }
  if (peers) peers_ = std::move(peers);
  for (Tracked& t : sessions_) {
    auto it = peers_->find(t.session->identity().communicator);
    t.peers = it != peers_->end() ? it->second : nullptr;
    t.session->loopback().set_peers(t.peers);
  }
  num_sessions_.store(static_cast<uint32_t>(sessions_.size()), std::memory_order_relaxed);
}

void Proxy::refresh_consumers(Tracked& t) {
  const uint32_t n = t.session->num_rings();
  while (t.rings.size() < n) {
    const SessionRing* r = t.session->ring(static_cast<uint32_t>(t.rings.size()));
    mp::ConsumerOptions o;
    o.limits.num_ranks = t.session->identity().world_size;
    o.limits.num_regions = t.session->quota().max_regions;
    o.limits.num_signals = mp::kNoSignal;  // flag bounds are checked at the destination
    o.tail_batch = 32;
    RingTrack track;
    track.consumer = std::make_unique<mp::RingConsumer>(r->view, o);
    t.rings.push_back(std::move(track));
  }
}

void Proxy::end_session(Tracked& t, Status why, uint32_t code, uint32_t detail, uint64_t pos) {
  const uint64_t id = t.session->id();
  if (t.session->end(why, code, detail, pos)) {
    if (uint64_t left_out = 0; ended_log_.allow(&left_out))  // note 8
      spdlog::warn("proxy {}: session {} ({}) ended: {}{}", options_.name, id,
                   quoted_printable(t.session->identity().name), printable(why.to_string(), 1024),
                   suppressed_note(left_out, "ended sessions"));
    t.end_unannounced = true;
  }
}

void Proxy::announce_ended() {
  for (Tracked& t : sessions_) {
    if (!t.end_unannounced) continue;
    t.end_unannounced = false;
    if (on_session_ended_) on_session_ended_(t.session->id());
  }
}

namespace {
// A WriteOp cookie: the ring index and the low bits of the command's ring position.
constexpr unsigned kCookiePosBits = 48;
constexpr uint64_t kCookiePosMask = (uint64_t{1} << kCookiePosBits) - 1;
}  // namespace

void Proxy::Tally::finish(Outcome o, int64_t taken_ns, int64_t now) {
  ++outcomes[static_cast<size_t>(o)];
  ++latency[std::min<size_t>(kLatencyBuckets - 1, std::bit_width(static_cast<uint64_t>(std::max<int64_t>(0, now - taken_ns))))];
}

void Proxy::advance(RingTrack& r) {
  uint64_t k = 0;
  while (!r.pending.empty() && r.pending.front().done) {
    r.pending.pop_front();
    ++k;
  }
  if (k) {
    r.base += k;
    r.consumer->add_completed(k);
  }
}

Proxy::Exec Proxy::execute(Tracked& t, uint32_t ri, const mp::Command& cmd, uint64_t pos, Tally& tally) {
  Session& s = *t.session;
  RingTrack& r = t.rings[ri];
  Pending& p = r.pending[pos - r.base];
  const bool is_write = cmd.op == mp::kOpWrite || cmd.op == mp::kOpWriteSignal;
  auto wait = [&](const char* why) {
    if (!r.waiting) {
      r.waiting = true;
      r.waiting_cmd = cmd;
      r.waiting_pos = pos;
      r.waiting_since_ns = now_ns();
    }
    r.waiting_for = why;
    return Exec::kWaiting;
  };
  auto finish_rejected = [&](mp::RejectReason why) {
    p.done = true;
    tally.finish(Outcome::kRejected, p.taken_ns, now_ns());
    end_session(t,
                Status(StatusCode::kInvalidArgument,
                       std::string("command at ring ") + std::to_string(ri) + " position " +
                           std::to_string(pos) + " rejected: " + mp::reject_reason_name(why)),
                kRingErrRejected, why, pos);
    return Exec::kDone;
  };
  auto finish_error = [&](const Status& st) {
    p.done = true;
    tally.finish(Outcome::kError, p.taken_ns, now_ns());
    ++tally.errors;
    end_session(t, st.with_context("command at ring " + std::to_string(ri) + " position " + std::to_string(pos)),
                kRingErrTransport, static_cast<uint32_t>(st.code()), pos);
    return Exec::kDone;
  };

  // Source checks: the region is this session's and the range lies inside it.
  if (is_write) {
    const Region* src = s.region(cmd.src_region);
    if (src == nullptr) return finish_rejected(mp::kRejectBadRegion);
    if (cmd.src_offset > src->bytes || cmd.num_bytes > src->bytes - cmd.src_offset)
      return finish_rejected(mp::kRejectBadOffset);
  }
  if (cmd.op == mp::kOpFence) {
    if (r.posted > 0) return wait("earlier commands of the ring to complete");
    p.done = true;
    tally.finish(Outcome::kOk, p.taken_ns, now_ns());
    return Exec::kDone;
  }
  // The route, then every destination check before anything is posted (design note 5).
  Route to;
  if (Status st = route_to(t, cmd.dst_rank, &to); !st.ok()) return finish_error(st);
  net::WriteOp op;
  op.cookie = (uint64_t{ri} << kCookiePosBits) | (pos & kCookiePosMask);
  op.peer = to.peer;
  if (is_write) {
    uint64_t dst_bytes = 0, remote_id = 0;
    if (!to.writable_region(cmd.dst_region, &dst_bytes, &remote_id)) return finish_rejected(mp::kRejectBadRegion);
    if (cmd.dst_offset > dst_bytes || cmd.num_bytes > dst_bytes - cmd.dst_offset)
      return finish_rejected(mp::kRejectBadOffset);
    SessionNetwork* net = s.network();
    op.local_region = to.remote != nullptr ? net->local_regions[cmd.src_region] : cmd.src_region;
    op.local_offset = cmd.src_offset;
    op.remote_region = remote_id;
    op.remote_offset = cmd.dst_offset;
    op.length = cmd.num_bytes;
  }
  if (cmd.op == mp::kOpWriteSignal || cmd.op == mp::kOpSignal) {
    if (cmd.signal_idx >= to.num_flags()) return finish_rejected(mp::kRejectBadSignal);
    op.has_signal = true;
    op.signal_idx = cmd.signal_idx;
    op.signal_value = cmd.signal_value;
  }
  if (cmd.op == mp::kOpSignal && !to.transport->capabilities().ordered_writes) {
    auto it = r.posted_to.find(cmd.dst_rank);
    if (it != r.posted_to.end() && it->second > 0) return wait("earlier writes to the rank to complete");
  }
  if (t.posted >= s.quota().max_inflight) return wait("the session's commands in flight (quota) to drop");
  const Status st = to.transport->post_write(op);
  if (st.code() == StatusCode::kUnavailable) return wait("room in the transport's queue");
  if (!st.ok()) return finish_error(st.with_context("posting to rank " + std::to_string(cmd.dst_rank)));
  p.posted = true;
  p.posted_ns = now_ns();
  p.dst_rank = cmd.dst_rank;
  p.bytes = is_write ? cmd.num_bytes : 0;
  ++r.posted;
  ++r.posted_to[cmd.dst_rank];
  ++t.posted;
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  return Exec::kPosted;
}

bool Route::writable_region(uint32_t id, uint64_t* bytes, uint64_t* remote_id) const {
  if (local != nullptr) {
    const Region* d = local->region(id);
    if (d == nullptr || !d->remote_writable) return false;
    *bytes = d->bytes;
    *remote_id = id;  // the loopback names regions by id (net_transport.h note 5)
    return true;
  }
  if (id >= remote->region_ids.size() || remote->region_ids[id] == UINT64_MAX) return false;
  *bytes = remote->region_bytes[id];
  *remote_id = remote->region_ids[id];
  return true;
}

uint32_t Route::num_flags() const {
  if (local != nullptr) return local->flags() != nullptr ? local->num_flags() : 0;
  return remote->flags;
}

Status Proxy::route_to(Tracked& t, uint32_t rank, Route* route) {
  Session& s = *t.session;
  SessionNetwork* net = s.network();
  if (net != nullptr && net->transport && rank < net->ranks.size() && net->ranks[rank].network) {
    route->transport = net->transport.get();
    route->peer = net->ranks[rank].peer;
    route->remote = &net->ranks[rank];
    return Status::Ok();
  }
  // Inside this daemon: the loopback, by rank.
  const Session* dst = t.peers ? t.peers->find(rank) : nullptr;
  if (dst == nullptr || dst->ended())
    return Status(StatusCode::kUnavailable, "rank " + std::to_string(rank) + " of communicator \"" +
                                                s.identity().communicator + "\" is not connected to this daemon");
  route->transport = &s.loopback();
  route->peer = rank;
  route->local = dst;
  return Status::Ok();
}

size_t Proxy::progress(Tracked& t, net::Transport& transport, Tally& tally) {
  completions_.clear();
  const size_t n = transport.poll(&completions_, &arrivals_);
  Session& s = *t.session;
  if (const Status& broken = transport.async_error(); !broken.ok() && !s.ended()) {
    // The endpoint failed as a whole (design note 7): nothing more will complete on it.
    uint64_t pos = 0;
    for (const RingTrack& r : t.rings)
      if (!r.pending.empty()) {
        pos = r.base;
        break;
      }
    end_session(t, broken.with_context(transport.capabilities().provider + " endpoint"), kRingErrTransport,
                static_cast<uint32_t>(broken.code()), pos);
  }
  if (n == 0) return 0;
  const int64_t now = now_ns();
  for (const net::Completion& c : completions_) {
    const uint64_t ri = c.cookie >> kCookiePosBits;
    if (ri >= t.rings.size()) continue;
    RingTrack& r = t.rings[ri];
    // Rebuild the full position from its low bits: it lies in [base, base + pending).
    const uint64_t idx = ((c.cookie & kCookiePosMask) - (r.base & kCookiePosMask)) & kCookiePosMask;
    if (idx >= r.pending.size() || !r.pending[idx].posted || r.pending[idx].done) {
      spdlog::error("proxy {}: session {}: a completion names no command in flight (ring {})",
                    options_.name, s.id(), ri);
      continue;
    }
    Pending& p = r.pending[idx];
    p.done = true;
    --r.posted;
    if (auto it = r.posted_to.find(p.dst_rank); it != r.posted_to.end() && --it->second == 0)
      r.posted_to.erase(it);
    --t.posted;
    in_flight_.fetch_sub(1, std::memory_order_relaxed);
    if (c.status.ok()) {
      tally.finish(Outcome::kOk, p.taken_ns, now);
      tally.bytes += p.bytes;
    } else {
      tally.finish(Outcome::kError, p.taken_ns, now);
      ++tally.errors;
      const uint64_t pos = r.base + idx;
      end_session(t,
                  c.status.with_context("write to rank " + std::to_string(p.dst_rank) + " (command at ring " +
                                        std::to_string(ri) + " position " + std::to_string(pos) + ")"),
                  kRingErrTransport, static_cast<uint32_t>(c.status.code()), pos);
    }
  }
  raise_flags(s);
  for (RingTrack& r : t.rings) advance(r);
  return n;
}

void Proxy::raise_flags(Session& s) {
  // The one place daemon code raises a flag (design note 6): never lower one, since signals of
  // one flag may arrive out of order on unordered transports; release, so that whoever
  // acquires the flag sees the data that came before the signal.
  uint64_t* flags = s.flags();
  const uint32_t nflags = s.num_flags();
  for (const net::Arrival& a : arrivals_) {
    if (flags == nullptr || a.signal_idx >= nflags) {
      spdlog::warn("proxy {}: session {}: a peer raised flag {} of {}; ignored", options_.name, s.id(),
                   a.signal_idx, nflags);
      continue;
    }
    uint64_t cur = __atomic_load_n(&flags[a.signal_idx], __ATOMIC_RELAXED);
    while (cur < a.signal_value &&
           !__atomic_compare_exchange_n(&flags[a.signal_idx], &cur, a.signal_value, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
    }
  }
  arrivals_.clear();
}

void Proxy::expire_posted(Tracked& t, uint32_t ri, int64_t now, Tally& tally) {
  // Positions are posted in order and the finished prefix is gone, so the oldest command in
  // flight is the front one.
  RingTrack& r = t.rings[ri];
  if (r.pending.empty()) return;
  Pending& p = r.pending.front();
  const int64_t timeout_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.command_timeout).count();
  if (!p.posted || p.done || now - p.posted_ns <= timeout_ns) return;
  p.done = true;
  --r.posted;
  if (auto it = r.posted_to.find(p.dst_rank); it != r.posted_to.end() && --it->second == 0) r.posted_to.erase(it);
  --t.posted;
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  tally.finish(Outcome::kError, p.taken_ns, now);
  ++tally.errors;
  end_session(t,
              Status(StatusCode::kDeadlineExceeded,
                     "write to rank " + std::to_string(p.dst_rank) + " (command at ring " + std::to_string(ri) +
                         " position " + std::to_string(r.base) + ") not completed within " +
                         std::to_string(options_.command_timeout.count()) + " ms: the transport reported nothing"),
              kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeadlineExceeded), r.base);
}

void Proxy::flush_ended(Tracked& t, Tally& tally) {
  // A session that ended takes nothing more and its transport is no longer driven: whatever it
  // had posted or held back is finished now, as an error, so every command taken is accounted.
  const int64_t now = now_ns();
  for (RingTrack& r : t.rings) {
    uint64_t k = 0;
    for (Pending& p : r.pending) {
      if (!p.done) {
        tally.finish(Outcome::kError, p.taken_ns, now);
        ++tally.errors;
      }
      ++k;
    }
    r.pending.clear();
    r.base += k;
    if (k) r.consumer->add_completed(k);
    r.posted = 0;
    r.posted_to.clear();
    r.waiting = false;
  }
  in_flight_.fetch_sub(t.posted, std::memory_order_relaxed);
  t.posted = 0;
  t.flushed = true;
}

void Proxy::publish(Tracked& t, const Tally& tally, size_t taken) {
  for (size_t i = 0; i < kNumOutcomes; ++i)
    if (tally.outcomes[i]) by_outcome_[i].fetch_add(tally.outcomes[i], std::memory_order_relaxed);
  for (size_t i = 0; i < kLatencyBuckets; ++i)
    if (tally.latency[i]) latency_[i].fetch_add(tally.latency[i], std::memory_order_relaxed);
  if (tally.bytes) bytes_.fetch_add(tally.bytes, std::memory_order_relaxed);
  if (tally.errors) errors_.fetch_add(tally.errors, std::memory_order_relaxed);
  if (taken) {
    t.session->commands.fetch_add(taken, std::memory_order_relaxed);
    consumed_.fetch_add(taken, std::memory_order_release);
  }
}

size_t Proxy::poll_session(Tracked& t) {
  Session& s = *t.session;
  Tally tally;
  if (s.ended()) {
    if (!t.flushed) {
      flush_ended(t, tally);
      publish(t, tally, 0);
    }
    return 0;
  }
  refresh_consumers(t);
  const uint32_t batch = batch_.load(std::memory_order_relaxed);
  const int64_t timeout_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.command_timeout).count();
  size_t work = 0, taken = 0;
  work += progress(t, s.loopback(), tally);
  SessionNetwork* net = s.network();
  if (net != nullptr && net->transport && !s.ended()) work += progress(t, *net->transport, tally);
  const int64_t now = now_ns();
  // What the proxy keeps per command taken and not finished is bounded by the session's
  // in-flight quota too: finished commands behind an unfinished one stay until it finishes.
  size_t pending_all = 0;
  for (const RingTrack& r : t.rings) pending_all += r.pending.size();
  for (uint32_t ri = 0; ri < t.rings.size() && !s.ended(); ++ri) {
    RingTrack& r = t.rings[ri];
    expire_posted(t, ri, now, tally);
    if (s.ended()) break;
    if (r.waiting) {
      const Exec e = execute(t, ri, r.waiting_cmd, r.waiting_pos, tally);
      if (e == Exec::kWaiting) {
        if (now_ns() - r.waiting_since_ns > timeout_ns) {
          Pending& p = r.pending[r.waiting_pos - r.base];
          p.done = true;
          tally.finish(Outcome::kError, p.taken_ns, now_ns());
          ++tally.errors;
          r.waiting = false;
          end_session(t,
                      Status(StatusCode::kDeadlineExceeded,
                             "command at ring " + std::to_string(ri) + " position " + std::to_string(r.waiting_pos) +
                                 " waited " + std::to_string(options_.command_timeout.count()) + " ms for " +
                                 r.waiting_for),
                      kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeadlineExceeded), r.waiting_pos);
        }
        advance(r);
        continue;
      }
      r.waiting = false;
      ++work;
    }
    if (s.ended()) break;
    // Each callback returns whether to go on: nothing more is taken from a session once it
    // ended, nor from a ring whose command waits.
    auto on_command = [&](const mp::Command& cmd, uint64_t pos) -> bool {
      ++taken;
      Pending p;
      p.taken_ns = now_ns();
      r.pending.push_back(p);
      const Exec e = execute(t, ri, cmd, pos, tally);
      return e != Exec::kWaiting && !s.ended();
    };
    auto on_reject = [&](const mp::CommandRecord&, mp::RejectReason why, uint64_t pos) -> bool {
      ++taken;
      tally.finish(Outcome::kRejected, now_ns(), now_ns());
      Pending p;
      p.done = true;
      r.pending.push_back(p);
      end_session(t,
                  Status(StatusCode::kInvalidArgument,
                         std::string("record at ring ") + std::to_string(ri) + " position " +
                             std::to_string(pos) + " rejected: " + mp::reject_reason_name(why)),
                  kRingErrRejected, why, pos);
      return false;
    };
    const size_t room = s.quota().max_inflight > pending_all ? s.quota().max_inflight - pending_all : 0;
    const size_t n = r.waiting || t.posted >= s.quota().max_inflight || room == 0
                         ? 0
                         : r.consumer->poll(std::min<size_t>(batch, room), on_command, on_reject);
    pending_all += n;
    work += n;
    advance(r);
  }
  publish(t, tally, taken);
  return work;
}

void Proxy::publish_occupancy() {
  uint64_t occ = 0, cap = 0, rings = 0;
  for (Tracked& t : sessions_) {
    if (t.session->ended()) continue;
    for (auto& ring : t.rings) {
      auto& c = ring.consumer;
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
  // Reading the clock costs about as much as an idle pass over the rings, so an idle spinner
  // reads it every kClockEvery-th pass only (the clock is then at most that many passes old:
  // well under a microsecond); after a pass that did work it reads it again at once.
  constexpr uint32_t kClockEvery = 16;
  uint32_t since_clock = kClockEvery;
  int64_t now = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    if (++since_clock >= kClockEvery) {
      now = now_ns();
      since_clock = 0;
    }
    const int64_t stall_until = stall_until_ns_.load(std::memory_order_acquire);
    if (stall_until > now) {  // test hook: a proxy that stopped checking in
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      since_clock = kClockEvery;
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
    announce_ended();
    if (work) {
      last_work = now;
      since_clock = kClockEvery;
      continue;
    }
    if (spin_.load(std::memory_order_relaxed) ||
        now - last_work < spin_for_us_.load(std::memory_order_relaxed) * 1000) {
      MK_PAUSE();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_for_us_.load(std::memory_order_relaxed)));
      since_clock = kClockEvery;  // after a sleep the clock moved on
    }
  }
  // Leave the tails published for anyone still looking.
  for (Tracked& t : sessions_) {
    for (auto& r : t.rings) r.consumer->publish_tail();
    t.session->loopback().set_peers(nullptr);
  }
  sessions_.clear();
}

}  // namespace mkernel::daemon
