// moe_replay.cc: the CPU replay of the fused MoE's protocol (moe_plan.h, moe_replay): every
// rank's kernel as coroutine agents in random interleavings.
#include <algorithm>
#include <coroutine>
#include <exception>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fused/moe/moe_plan.h"

namespace mkernel::kernels {

namespace {
std::string str(uint64_t v) { return std::to_string(v); }
}  // namespace

// ---- replay ------------------------------------------------------------------------------------

// Waits inside an agent: the awaiter is a named variable (GCC 12 destroys temporaries of a
// co_await expression twice when they own memory), and an aborted launch ends the agent.
#define MK_AWAIT(awaiter)                   \
  do {                                      \
    auto mk_awaiter_ = (awaiter);           \
    if (!co_await mk_awaiter_) co_return;   \
  } while (0)

namespace {

// A minimal coroutine: an agent runs until it waits, the scheduler resumes it once the condition
// holds (or the launch was aborted: then the wait returns false and the agent ends).
struct Agent {
  struct promise_type {
    std::function<bool()> ready;
    std::string waiting_for;
    Agent get_return_object() { return Agent{std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    std::exception_ptr failure;  // an agent that threw (std::bad_alloc, say): the replay reports it
    void unhandled_exception() { failure = std::current_exception(); }
  };
  explicit Agent(std::coroutine_handle<promise_type> handle) : h(handle) {}
  Agent(Agent&& o) noexcept : h(std::exchange(o.h, {})) {}
  Agent& operator=(Agent&& o) noexcept {
    if (this != &o) {
      if (h) h.destroy();
      h = std::exchange(o.h, {});
    }
    return *this;
  }
  ~Agent() {
    if (h) h.destroy();
  }
  std::coroutine_handle<promise_type> h;
};

// Cell contents: which launch wrote it, what it holds, and how many reads it still owes.
struct TokenCell {
  uint64_t launch = 0;
  uint32_t home = 0, token = 0;
  uint32_t readers = 0;
};
struct PartialCell {
  uint64_t launch = 0;
  uint32_t home = 0, token = 0;
  std::multiset<int32_t> experts;  // the contributions summed into it
  uint32_t readers = 0;
};
struct CountCell {
  uint64_t launch = 0;
  std::vector<uint32_t> words;
  uint32_t readers = 0;
};
struct RowCell {
  uint64_t launch = 0;
  uint32_t home = 0, token = 0;
  int32_t expert = -1;
};

struct Rank {
  std::map<uint32_t, uint64_t> nvl, net;  // flags (launch numbers)
  std::vector<CountCell> count;           // [world]
  std::vector<TokenCell> tok;             // [world][cap]
  std::vector<PartialCell> partial;       // [gpus][nodes][cap]
  std::vector<CountCell> net_count;       // [nodes]
  std::vector<TokenCell> net_tok;         // [nodes][cap]
  std::vector<PartialCell> net_partial;   // [nodes][cap]
  std::vector<RowCell> rows, y;           // expert-ordered rows and the GEMM's output rows
  std::vector<uint64_t> expanded;         // [world] by source index: launch expanded
  std::vector<uint64_t> band_done;        // by band: launch computed
  uint64_t layout_ready = 0;
  MoeRowLayout row_layout;
  std::vector<std::vector<uint32_t>> combine_counts;  // the count records, kept for the combine
  std::vector<std::pair<uint64_t, uint64_t>> bands;  // [first row, end row), in expert order
  uint32_t agents_left = 0;
  uint64_t launch = 0;                    // the launch running (0: none yet)
};

class Replay {
 public:
  Replay(const FusedLayout& layout, uint32_t tokens, uint32_t experts, uint32_t top_k, const MoeReplayOptions& o)
      : l_(layout), o_(o), rng_(o.seed) {
    g_.layout = layout;
    g_.tokens = tokens;
    g_.hidden = 8;
    g_.out_hidden = 8;
    g_.experts = experts;
    g_.top_k = top_k;
    g_.recv_tokens_per_source = o.recv_tokens_per_source;
    g_.expert_rows_capacity = o.expert_rows_capacity;
    g_.chunk_tokens = o.chunk_tokens;
  }

  MoeReplayReport run() {
    const uint32_t world = l_.world();
    if (std::string e = moe_check_geometry(g_); !e.empty()) return fail(e);
    ranks_.assign(world, Rank{});
    const uint32_t cap = g_.capacity();
    for (auto& r : ranks_) {
      r.count.assign(world, {});
      r.tok.assign(size_t{world} * cap, {});
      r.partial.assign(size_t{l_.gpus} * l_.nodes * cap, {});
      r.net_count.assign(l_.nodes, {});
      r.net_tok.assign(size_t{l_.nodes} * cap, {});
      r.net_partial.assign(size_t{l_.nodes} * cap, {});
      r.rows.assign(g_.rows_capacity(), {});
      r.y.assign(g_.rows_capacity(), {});
      r.expanded.assign(world, 0);
    }
    choices_.assign(world, {});
    routing_.assign(world, {});
    rep_.launch_errors.assign(world, "");
    for (uint32_t r = 0; r < world; ++r) start_launch(r, 1);
    while (rep_.error.empty()) {
      std::vector<size_t> runnable;
      for (size_t i = 0; i < agents_.size(); ++i)
        if (agents_[i].h && !agents_[i].h.done() && can_run(agents_[i])) runnable.push_back(i);
      if (runnable.empty()) break;
      size_t pick = runnable[rng_() % runnable.size()];
      if (o_.fast_rank < world && rng_() % 4 != 0) {  // that rank runs ahead: 3 of 4 turns are its own
        std::vector<size_t> mine;
        for (size_t i : runnable)
          if (owners_[i] == o_.fast_rank) mine.push_back(i);
        if (!mine.empty()) pick = mine[rng_() % mine.size()];
      }
      Agent& a = agents_[pick];
      a.h.promise().ready = nullptr;
      a.h.resume();
      if (a.h.promise().failure) {
        std::string what = "an exception";
        try {
          std::rethrow_exception(a.h.promise().failure);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        return fail(names_[pick] + " stopped: " + what);
      }
      if (a.h.done()) finish_agent(pick);
    }
    if (!rep_.error.empty()) return rep_;
    for (size_t i = 0; i < agents_.size(); ++i)
      if (agents_[i].h && !agents_[i].h.done())
        return fail("stuck: " + names_[i] + " waits for " + agents_[i].h.promise().waiting_for +
                    ", which nobody raises");
    if (abort_launch_) {
      for (uint32_t r = 0; r < world; ++r)
        if (rep_.launch_errors[r].empty())
          return fail("rank " + str(r) + " ended launch " + str(abort_launch_) + " without a cause ('" + abort_cause_ +
                      "' stopped it)");
    }
    return rep_;
  }

 private:
  // ---- scheduling ----
  struct Until {
    Replay* rp;
    uint64_t launch;
    std::function<bool()> cond;
    std::string what;
    bool await_ready() const noexcept { return false; }  // every wait is a point where others may run
    void await_suspend(std::coroutine_handle<Agent::promise_type> h) {
      Replay* p = rp;
      const uint64_t L = launch;
      auto c = cond;
      h.promise().ready = [p, L, c] { return p->aborted(L) || !c || c(); };
      h.promise().waiting_for = what;
    }
    bool await_resume() const { return !rp->aborted(launch); }
  };
  Until until(uint64_t L, std::function<bool()> c, std::string what) { return Until{this, L, std::move(c), std::move(what)}; }
  Until yield(uint64_t L) { return Until{this, L, nullptr, "its turn"}; }

  bool can_run(Agent& a) { return !a.h.promise().ready || a.h.promise().ready(); }
  bool aborted(uint64_t L) const { return abort_launch_ != 0 && L >= abort_launch_; }

  void spawn(uint32_t r, Agent a, std::string name) {
    agents_.push_back(std::move(a));
    owners_.push_back(r);
    names_.push_back("rank " + str(r) + " " + name);
    ++ranks_[r].agents_left;
  }

  void finish_agent(size_t i) {
    const uint32_t r = owners_[i];
    agents_[i] = Agent(std::coroutine_handle<Agent::promise_type>{});
    Rank& rk = ranks_[r];
    if (--rk.agents_left != 0) return;
    const uint64_t L = rk.launch;
    if (aborted(L)) {
      if (rep_.launch_errors[r].empty()) rep_.launch_errors[r] = "peer aborted: " + abort_cause_;
      return;  // the replay ends with this launch
    }
    // The launch is over: raise done(r) on every node peer and slot_free on every rail peer.
    for (uint32_t i2 = 0; i2 < l_.gpus; ++i2) ranks_[l_.rank_of(l_.node_of(r), i2)].nvl[l_.done_flag(r)] = L;
    for (uint32_t n = 0; n < l_.nodes; ++n)
      if (n != l_.node_of(r)) ranks_[l_.rail_peer(r, n)].net[l_.slot_free_flag(l_.node_of(r))] = L;
    if (L < o_.launches) start_launch(r, L + 1);
  }

  void end_launch_on(uint32_t r, uint64_t L, const std::string& cause) {
    if (!abort_launch_ || L < abort_launch_) {
      abort_launch_ = L;
      abort_cause_ = cause;
    }
    if (rep_.launch_errors[r].empty()) rep_.launch_errors[r] = cause;
  }

  MoeReplayReport fail(const std::string& e) {
    if (rep_.error.empty()) rep_.error = e;
    return rep_;
  }
  void check(bool ok, const std::function<std::string()>& why) {
    if (!ok && rep_.error.empty()) rep_.error = why();
  }

  // ---- helpers ----
  uint32_t chunk_of(uint32_t pos) const { return pos / g_.chunk(); }
  static uint64_t flag(const std::map<uint32_t, uint64_t>& m, uint32_t i) {
    auto it = m.find(i);
    return it == m.end() ? 0 : it->second;
  }
  const int32_t* choice_row(uint32_t s, uint32_t t) const { return choices_[s].data() + size_t{t} * g_.top_k; }
  MoeGeometry geo(uint32_t r) const {
    MoeGeometry g = g_;
    g.rank = r;
    return g;
  }
  // Writes a token cell, checking the previous launch's readers are done with it.
  void write_token(TokenCell& c, uint64_t L, uint32_t home, uint32_t token, uint32_t readers, const std::string& where) {
    check(c.readers == 0 || c.launch >= L, [&] {
      return where + ": overwritten in launch " + str(L) + " while launch " + str(c.launch) + " still had " +
             str(c.readers) + " reads to make";
    });
    check(!(c.launch == L && c.readers != 0), [&] { return where + ": written twice in launch " + str(L); });
    c = TokenCell{L, home, token, readers};
  }
  void read_token(TokenCell& c, uint64_t L, uint32_t home, uint32_t token, const std::string& where) {
    check(c.launch == L && c.home == home && c.token == token, [&] {
      return where + ": holds launch " + str(c.launch) + " rank " + str(c.home) + " token " + str(c.token) +
             ", expected launch " + str(L) + " rank " + str(home) + " token " + str(token);
    });
    check(c.readers > 0, [&] { return where + ": read more often than its readers"; });
    if (c.readers) --c.readers;
  }
  void write_partial(PartialCell& c, uint64_t L, uint32_t home, uint32_t token, std::multiset<int32_t> e,
                     const std::string& where) {
    check(c.readers == 0 || c.launch >= L, [&] {
      return where + ": partial overwritten in launch " + str(L) + " before launch " + str(c.launch) + " read it";
    });
    check(!(c.launch == L && c.readers != 0), [&] { return where + ": partial written twice in launch " + str(L); });
    c = PartialCell{L, home, token, std::move(e), 1};
  }
  const std::multiset<int32_t>& read_partial(PartialCell& c, uint64_t L, uint32_t home, uint32_t token,
                                             const std::string& where) {
    check(c.launch == L && c.home == home && c.token == token && c.readers == 1, [&] {
      return where + ": partial holds launch " + str(c.launch) + " rank " + str(c.home) + " token " + str(c.token) +
             " (reads owed " + str(c.readers) + "), expected launch " + str(L) + " rank " + str(home) + " token " +
             str(token);
    });
    c.readers = 0;
    return c.experts;
  }
  void write_count(CountCell& c, uint64_t L, std::vector<uint32_t> words, uint32_t readers, const std::string& where) {
    check(c.readers == 0 || c.launch >= L, [&] {
      return where + ": count record overwritten in launch " + str(L) + " before launch " + str(c.launch) + " read it";
    });
    c = CountCell{L, std::move(words), readers};
  }
  const std::vector<uint32_t>& read_count(CountCell& c, uint64_t L, const std::string& where) {
    check(c.launch == L && c.readers > 0, [&] {
      return where + ": count record of launch " + str(c.launch) + " (reads owed " + str(c.readers) +
             "), expected launch " + str(L);
    });
    if (c.readers) --c.readers;
    return c.words;
  }
  size_t tok_index(uint32_t s, uint32_t p) const { return size_t{s} * g_.capacity() + p; }
  size_t net_index(uint32_t n, uint32_t q) const { return size_t{n} * g_.capacity() + q; }
  size_t partial_index(uint32_t l, uint32_t n, uint32_t p) const {
    return (size_t{l} * l_.nodes + n) * g_.capacity() + p;
  }
  // The count record source s sends rank d: tokens, then rows per expert of d.
  std::vector<uint32_t> count_record(uint64_t L, uint32_t s, uint32_t d) {
    const MoeRouting& R = saved_routing_[L][s];
    const uint32_t epr = g_.experts_per_rank();
    std::vector<uint32_t> w{R.send_tokens[d]};
    w.insert(w.end(), R.rows.begin() + size_t{d} * epr, R.rows.begin() + size_t{d + 1} * epr);
    if (o_.fault == MoePlanFault::kDropLastToken && s == 0 && d == last_dest_[L] && w[0] > 0) --w[0];
    return w;
  }
  // Tokens of s bound for rank d, in pos order.
  std::vector<uint32_t> tokens_to(uint64_t L, uint32_t s, uint32_t d) {
    std::vector<uint32_t> out;
    const MoeRouting& R = saved_routing_[L][s];
    for (uint32_t t = 0; t < g_.tokens; ++t)
      if (R.pos[size_t{t} * l_.world() + d] != kMoeNoChoice) out.push_back(t);
    if (o_.fault == MoePlanFault::kDropLastToken && s == 0 && d == last_dest_[L] && !out.empty()) out.pop_back();
    return out;
  }
  std::vector<uint32_t> tokens_to_node(uint64_t L, uint32_t s, uint32_t n) {
    std::vector<uint32_t> out;
    const MoeRouting& R = saved_routing_[L][s];
    for (uint32_t t = 0; t < g_.tokens; ++t)
      if (R.npos[size_t{t} * l_.nodes + n] != kMoeNoChoice) out.push_back(t);
    return out;
  }

  // ---- a launch ----
  void start_launch(uint32_t r, uint64_t L) {
    Rank& rk = ranks_[r];
    rk.launch = L;
    // The routing of this launch (the same on every rank's view: a graph replay with new routing).
    if (routing_epoch_ < L) {
      routing_epoch_ = L;
      for (uint32_t s = 0; s < l_.world(); ++s) {
        choices_[s] = moe_make_routing(o_.route, g_.tokens, g_.experts, g_.top_k, l_.world(), s, o_.seed * 7919 + L);
        routing_[s] = moe_route(geo(s), choices_[s].data());
      }
      last_dest_[L] = 0;  // rank 0's last destination on its own node (the kDropLastToken fault)
      for (uint32_t d = 0; d < l_.gpus; ++d)
        if (routing_[0].error.empty() && routing_[0].send_tokens[d] > 0) last_dest_[L] = d;
      saved_choices_[L] = choices_;
      saved_routing_[L] = routing_;
    }
    spawn(r, sender(r, L), "sender");
    if (l_.nodes > 1) spawn(r, forwarder(r, L), "forwarder");
    spawn(r, expander(r, L), "expander");
    spawn(r, gemm(r, L, 0), "gemm block 0");
    spawn(r, gemm(r, L, 1), "gemm block 1");
    spawn(r, combiner(r, L), "combiner");
    if (l_.nodes > 1) spawn(r, aggregator(r, L), "aggregator");
    spawn(r, home(r, L), "home sum");
  }

  const MoeRouting& R(uint64_t L, uint32_t s) { return saved_routing_[L][s]; }
  const int32_t* C(uint64_t L, uint32_t s, uint32_t t) { return saved_choices_[L][s].data() + size_t{t} * g_.top_k; }

  // Note 2-4: counts, then tokens, to every rank of the node; counts, then tokens, to every other
  // node's rail peer.
  Agent sender(uint32_t s, uint64_t L) {
    const uint32_t world = l_.world(), own = l_.node_of(s);
    MK_AWAIT(yield(L));
    const MoeRouting& Rs = R(L, s);
    if (!Rs.error.empty()) {
      end_launch_on(s, L, Rs.error);
      co_return;
    }
    auto wait_done = [&](uint32_t d) {
      const bool skip = d == s || o_.fault == MoePlanFault::kNoDoneWait;
      return until(L, [this, s, d, L, skip] { return skip || flag(ranks_[s].nvl, l_.done_flag(d)) >= L - 1; },
                   "done(" + str(d) + ") of launch " + str(L - 1));
    };
    auto wait_free = [&](uint32_t n) {
      return until(L, [this, s, n, L] { return flag(ranks_[s].net, l_.slot_free_flag(n)) >= L - 1; },
                   "slot_free(" + str(n) + ") of launch " + str(L - 1));
    };
    // Count records to the node's ranks (self first).
    for (uint32_t i = 0; i < l_.gpus; ++i) {
      const uint32_t d = i == 0 ? s : l_.node_peer(s, i);
      MK_AWAIT(wait_done(d));
      write_count(ranks_[d].count[s], L, count_record(L, s, d), 1, "rank " + str(d) + " count record [" + str(s) + "]");
      ranks_[d].nvl[geo(d).count_flag(s)] = L;
    }
    // Count records to other nodes, through the rail peers.
    for (uint32_t i = 1; i < l_.nodes; ++i) {
      const uint32_t n = l_.send_node(own, i), f = l_.rail_peer(s, n);
      MK_AWAIT(wait_free(n));
      std::vector<uint32_t> w{Rs.node_tokens[n]};
      for (uint32_t j = 0; j < l_.gpus; ++j) {
        const auto rec = count_record(L, s, l_.rank_of(n, j));
        w.insert(w.end(), rec.begin(), rec.end());
      }
      write_count(ranks_[f].net_count[own], L, std::move(w), 1, "rank " + str(f) + " network count record [" + str(own) + "]");
      ranks_[f].net[geo(f).net_count_flag(own)] = L;
    }
    // Tokens to the node's ranks, a chunk at a time.
    for (uint32_t i = 0; i < l_.gpus; ++i) {
      const uint32_t d = i == 0 ? s : l_.node_peer(s, i);
      const std::vector<uint32_t> ts = tokens_to(L, s, d);
      const uint32_t copies = o_.fault == MoePlanFault::kSendPerChoice ? 2 : 1;
      for (uint32_t c = 0; c * g_.chunk() < ts.size(); ++c) {
        MK_AWAIT(yield(L));
        for (uint32_t p = c * g_.chunk(); p < std::min<size_t>(ts.size(), (c + 1) * g_.chunk()); ++p) {
          const uint32_t t = ts[p];
          check(Rs.pos[size_t{t} * world + d] == p, [&] { return std::string("pos() is not dense in token order"); });
          for (uint32_t k = 0; k < copies; ++k)
            write_token(ranks_[d].tok[tok_index(s, p)], L, s, t, 2,
                        "rank " + str(d) + " token region [" + str(s) + "] position " + str(p));
          if (d != s) ++rep_.nvlink_token_transfers;
          moved_[{L, s, t, d}] += 1;
        }
        ranks_[d].nvl[geo(d).token_flag(s, c)] = L;
      }
    }
    // Tokens to other nodes, once per node.
    for (uint32_t i = 1; i < l_.nodes; ++i) {
      const uint32_t n = l_.send_node(own, i), f = l_.rail_peer(s, n);
      const std::vector<uint32_t> ts = tokens_to_node(L, s, n);
      for (uint32_t c = 0; c * g_.chunk() < ts.size(); ++c) {
        MK_AWAIT(yield(L));
        for (uint32_t q = c * g_.chunk(); q < std::min<size_t>(ts.size(), (c + 1) * g_.chunk()); ++q) {
          write_token(ranks_[f].net_tok[net_index(own, q)], L, s, ts[q], 2,
                      "rank " + str(f) + " network token slot [" + str(own) + "] position " + str(q));
          ++rep_.network_token_transfers;
          ++net_crossings_[{L, s, ts[q], n}];
        }
        ranks_[f].net[geo(f).net_token_flag(own, c)] = L;
      }
    }
  }

  // Note 3: rail peer f forwards what node n's rank sent to the ranks of its own node.
  Agent forwarder(uint32_t f, uint64_t L) {
    const uint32_t own = l_.node_of(f), world = l_.world();
    for (uint32_t i = 1; i < l_.nodes; ++i) {
      const uint32_t n = l_.recv_node(own, i), s = l_.rail_peer(f, n);
      MK_AWAIT(until(L, [this, f, n, L] { return flag(ranks_[f].net, geo(f).net_count_flag(n)) >= L; },
                          "network count record from node " + str(n)));
      const std::vector<uint32_t> w = read_count(ranks_[f].net_count[n], L, "rank " + str(f) + " network count record [" + str(n) + "]");
      const uint32_t node_tokens = w[0];
      for (uint32_t j = 0; j < l_.gpus; ++j) {
        const uint32_t d = l_.rank_of(own, j);
        MK_AWAIT(until(L, [this, f, d, L] { return d == f || flag(ranks_[f].nvl, l_.done_flag(d)) >= L - 1; },
                            "done(" + str(d) + ") of launch " + str(L - 1)));
        std::vector<uint32_t> rec(w.begin() + 1 + size_t{j} * g_.count_words(), w.begin() + 1 + size_t{j + 1} * g_.count_words());
        write_count(ranks_[d].count[s], L, std::move(rec), 1, "rank " + str(d) + " count record [" + str(s) + "]");
        ranks_[d].nvl[geo(d).count_flag(s)] = L;
      }
      // Tokens: per chunk of the network slot, to each destination rank at its pos(); a rank's
      // chunk flag goes up once its last token is in.
      std::vector<uint32_t> written(l_.gpus, 0), total(l_.gpus, 0);
      for (uint32_t j = 0; j < l_.gpus; ++j) total[j] = w[1 + size_t{j} * g_.count_words()];
      for (uint32_t c = 0; c * g_.chunk() < node_tokens; ++c) {
        MK_AWAIT(until(L, [this, f, n, c, L] { return flag(ranks_[f].net, geo(f).net_token_flag(n, c)) >= L; },
                            "network token chunk " + str(c) + " from node " + str(n)));
        for (uint32_t q = c * g_.chunk(); q < std::min(node_tokens, (c + 1) * g_.chunk()); ++q) {
          TokenCell& cell = ranks_[f].net_tok[net_index(n, q)];
          const uint32_t t = cell.token;  // the record names the token; the check below proves it is right
          read_token(cell, L, s, t, "rank " + str(f) + " network token slot [" + str(n) + "] position " + str(q));
          check(R(L, s).npos[size_t{t} * l_.nodes + own] == q, [&] { return std::string("npos() mismatch"); });
          for (uint32_t j = 0; j < l_.gpus; ++j) {
            const uint32_t d = l_.rank_of(own, j);
            const uint32_t p = R(L, s).pos[size_t{t} * world + d];  // from the record
            if (p == kMoeNoChoice) continue;
            const uint32_t copies = (o_.fault == MoePlanFault::kForwardTwice && j == 0) ? 2 : 1;
            for (uint32_t k = 0; k < copies; ++k)
              write_token(ranks_[d].tok[tok_index(s, p)], L, s, t, 2,
                          "rank " + str(d) + " token region [" + str(s) + "] position " + str(p));
            if (d != f) ++rep_.nvlink_token_transfers;
            moved_[{L, s, t, d}] += 1;
            ++written[j];
            if (written[j] % g_.chunk() == 0 || written[j] == total[j])
              ranks_[d].nvl[geo(d).token_flag(s, (written[j] - 1) / g_.chunk())] = L;
          }
        }
      }
    }
  }

  // Note 5: the receiver lays out its expert rows once every count record is in, then copies each
  // source's tokens into them, sources in arrival order.
  Agent expander(uint32_t d, uint64_t L) {
    const uint32_t world = l_.world(), epr = g_.experts_per_rank(), k = g_.top_k;
    std::vector<std::vector<uint32_t>> counts(world);
    for (uint32_t i = 0; i < world; ++i) {
      const uint32_t s = moe_source_order(l_, d, i);
      check(moe_source_index(l_, d, s) == i, [&] { return "moe_source_index is not the inverse of moe_source_order"; });
      MK_AWAIT(until(L, [this, d, s, L] { return flag(ranks_[d].nvl, geo(d).count_flag(s)) >= L; },
                          "count record from rank " + str(s)));
      counts[s] = read_count(ranks_[d].count[s], L, "rank " + str(d) + " count record [" + str(s) + "]");
    }
    Rank& rk = ranks_[d];
    rk.row_layout = moe_row_layout(geo(d), counts);
    if (!rk.row_layout.error.empty()) {
      end_launch_on(d, L, rk.row_layout.error);
      co_return;
    }
    // Bands of 128 rows within each expert (the grouped GEMM's tiles).
    rk.bands.clear();
    for (uint32_t e = 0; e < epr; ++e)
      for (uint64_t r0 = rk.row_layout.expert_base[e]; r0 < rk.row_layout.expert_base[e + 1]; r0 += 128)
        rk.bands.push_back({r0, std::min(r0 + 128, rk.row_layout.expert_base[e + 1])});
    rk.band_done.assign(rk.bands.size(), 0);
    rk.layout_ready = L;
    rk.combine_counts = counts;
    for (uint32_t i = 0; i < world; ++i) {
      const uint32_t s = moe_source_order(l_, d, i);
      const uint32_t n_tok = counts[s][0];
      for (uint32_t c = 0; c * g_.chunk() < n_tok; ++c) {
        const bool skip = o_.fault == MoePlanFault::kExpandUnflagged;
        MK_AWAIT(until(L, [this, d, s, c, L, skip] { return skip || flag(ranks_[d].nvl, geo(d).token_flag(s, c)) >= L; },
                            "token chunk " + str(c) + " from rank " + str(s)));
        for (uint32_t p = c * g_.chunk(); p < std::min(n_tok, (c + 1) * g_.chunk()); ++p) {
          TokenCell& cell = rk.tok[tok_index(s, p)];
          const uint32_t t = cell.token;
          read_token(cell, L, s, t, "rank " + str(d) + " token region [" + str(s) + "] position " + str(p));
          check(R(L, s).pos[size_t{t} * world + d] == p, [&] {
            return "rank " + str(d) + " region [" + str(s) + "] position " + str(p) + " holds token " + str(t) +
                   " whose pos() there is " + str(R(L, s).pos[size_t{t} * world + d]);
          });
          const int32_t* ch = C(L, s, t);
          for (uint32_t j = 0; j < k; ++j) {
            if (ch[j] < 0 || g_.shape().rank_of_expert(ch[j]) != d) continue;
            const uint32_t slot = R(L, s).slot[size_t{t} * k + j];
            const uint64_t row = rk.row_layout.row_of(ch[j] % epr, s, slot);
            check(row < rk.row_layout.expert_base[ch[j] % epr + 1], [&] { return std::string("row outside its expert"); });
            RowCell& rc = rk.rows[row];
            check(rc.launch != L, [&] { return "rank " + str(d) + " expert row " + str(row) + " written twice"; });
            rc = RowCell{L, s, t, ch[j]};
          }
        }
      }
      rk.expanded[i] = L;
    }
  }

  // The grouped GEMM: bands taken round-robin by two blocks; a band waits until every source
  // whose rows it holds is expanded.
  Agent gemm(uint32_t d, uint64_t L, uint32_t block) {
    MK_AWAIT(until(L, [this, d, L] { return ranks_[d].layout_ready >= L; }, "the row layout"));
    Rank& rk = ranks_[d];
    const uint32_t world = l_.world(), epr = g_.experts_per_rank();
    for (size_t b = block; b < rk.bands.size(); b += 2) {
      const auto [r0, r1] = rk.bands[b];
      // The expert and the sources the band spans.
      uint32_t e = 0;
      while (rk.row_layout.expert_base[e + 1] <= r0) ++e;
      std::vector<uint32_t> need;
      for (uint32_t i = 0; i < world; ++i) {
        const uint32_t s = moe_source_order(l_, d, i);
        const uint64_t lo = rk.row_layout.expert_base[e] + rk.row_layout.source_base[size_t{e} * world + s];
        const uint64_t hi = lo + rk.combine_counts[s][1 + e];
        if (lo < r1 && hi > r0) need.push_back(i);
      }
      MK_AWAIT(until(L, [this, d, need, L] {
            for (uint32_t i : need)
              if (ranks_[d].expanded[i] < L) return false;
            return true;
          }, "sources of band " + str(b)));
      bool all = true;
      for (uint32_t i = 0; i < world; ++i) all = all && rk.expanded[i] >= L;
      if (!all) ++rep_.gemm_bands_started_early;
      for (uint64_t row = r0; row < r1; ++row) {
        check(rk.rows[row].launch == L && rk.rows[row].expert >= 0 &&
                  static_cast<uint32_t>(rk.rows[row].expert) == d * epr + e, [&] {
          return "rank " + str(d) + " expert row " + str(row) + " not expanded (launch " + str(rk.rows[row].launch) +
                 ") when its band was computed";
        });
        rk.y[row] = rk.rows[row];
        ++rep_.rows;
      }
      rk.band_done[b] = L;
    }
  }

  // Note 6: one partial per received token, back the way the token came.
  Agent combiner(uint32_t d, uint64_t L) {
    MK_AWAIT(until(L, [this, d, L] { return ranks_[d].layout_ready >= L; }, "the row layout"));
    Rank& rk = ranks_[d];
    const uint32_t world = l_.world(), epr = g_.experts_per_rank(), k = g_.top_k, own = l_.node_of(d);
    std::set<uint32_t> waited;
    for (uint32_t i = 0; i < world; ++i) {
      const uint32_t s = moe_source_order(l_, d, i);
      const uint32_t n_tok = rk.combine_counts[s][0];
      const uint32_t target = l_.node_of(s) == own ? s : l_.rank_of(own, l_.local_of(s));  // home or its rail peer
      // The token records of a source are read once the expander is through with it.
      MK_AWAIT(until(L, [this, d, i, L] { return ranks_[d].expanded[i] >= L; }, "source " + str(s) + " expanded"));
      for (uint32_t p = 0; p < n_tok; ++p) {
        TokenCell& cell = rk.tok[tok_index(s, p)];
        const uint32_t t = cell.token;
        std::vector<uint64_t> rows;
        const int32_t* ch = C(L, s, t);
        for (uint32_t j = 0; j < k; ++j)
          if (ch[j] >= 0 && g_.shape().rank_of_expert(ch[j]) == d)
            rows.push_back(rk.row_layout.row_of(ch[j] % epr, s, R(L, s).slot[size_t{t} * k + j]));
        MK_AWAIT(until(L, [this, d, rows, L] {
              Rank& x = ranks_[d];
              for (uint64_t row : rows) {
                size_t b = 0;
                while (x.bands[b].second <= row) ++b;
                if (x.band_done[b] < L) return false;
              }
              return true;
            }, "the bands of token " + str(t) + " from rank " + str(s)));
        if (!waited.count(target)) {
          MK_AWAIT(until(L, [this, d, target, L] { return target == d || flag(ranks_[d].nvl, l_.done_flag(target)) >= L - 1; },
                              "done(" + str(target) + ") of launch " + str(L - 1)));
          waited.insert(target);
        }
        read_token(cell, L, s, t, "rank " + str(d) + " token region [" + str(s) + "] position " + str(p) + " (combine)");
        std::multiset<int32_t> sum;
        for (uint64_t row : rows) {
          check(rk.y[row].launch == L && rk.y[row].home == s && rk.y[row].token == t, [&] {
            return "rank " + str(d) + " output row " + str(row) + " is not token " + str(t) + " of rank " + str(s);
          });
          sum.insert(rk.y[row].expert);
        }
        write_partial(ranks_[target].partial[partial_index(l_.local_of(d), l_.node_of(s), p)], L, s, t, std::move(sum),
                      "rank " + str(target) + " partial region [" + str(l_.local_of(d)) + "][" + str(l_.node_of(s)) +
                          "] position " + str(p));
        if (target != d) ++rep_.nvlink_partial_transfers;
        if ((p + 1) % g_.chunk() == 0 || p + 1 == n_tok)
          ranks_[target].nvl[geo(target).partial_flag(l_.local_of(d), l_.node_of(s), p / g_.chunk())] = L;
      }
    }
  }

  // Note 6: rank f sums its node's partials of the tokens it forwarded and sends one row home.
  Agent aggregator(uint32_t f, uint64_t L) {
    const uint32_t own = l_.node_of(f), world = l_.world();
    for (uint32_t i = 1; i < l_.nodes; ++i) {
      const uint32_t n = l_.recv_node(own, i), s = l_.rail_peer(f, n);
      MK_AWAIT(until(L, [this, f, n, L] { return flag(ranks_[f].net, geo(f).net_count_flag(n)) >= L; },
                          "network count record from node " + str(n)));
      MK_AWAIT(until(L, [this, f, n, L] { return flag(ranks_[f].net, l_.slot_free_flag(n)) >= L - 1; },
                          "slot_free(" + str(n) + ") of launch " + str(L - 1)));
      const std::vector<uint32_t> ts = tokens_to_node(L, s, own);  // what the slot's records list, in order
      for (uint32_t q = 0; q < ts.size(); ++q) {
        const uint32_t t = ts[q];
        std::multiset<int32_t> sum;
        for (uint32_t j = 0; j < l_.gpus; ++j) {
          const uint32_t d = l_.rank_of(own, j);
          const uint32_t p = R(L, s).pos[size_t{t} * world + d];
          if (p == kMoeNoChoice) continue;
          MK_AWAIT(until(L, [this, f, j, n, p, L] {
                return flag(ranks_[f].nvl, geo(f).partial_flag(j, n, p / g_.chunk())) >= L;
              }, "partial chunk " + str(p / g_.chunk()) + " from local " + str(j) + " for node " + str(n)));
          const auto& part = read_partial(ranks_[f].partial[partial_index(j, n, p)], L, s, t,
                                          "rank " + str(f) + " partial region [" + str(j) + "][" + str(n) + "] position " + str(p));
          sum.insert(part.begin(), part.end());
        }
        read_token(ranks_[f].net_tok[net_index(n, q)], L, s, t,
                   "rank " + str(f) + " network token slot [" + str(n) + "] position " + str(q) + " (combine)");
        write_partial(ranks_[s].net_partial[net_index(own, q)], L, s, t, std::move(sum),
                      "rank " + str(s) + " network partial slot [" + str(own) + "] position " + str(q));
        ++rep_.network_partial_transfers;
        ++net_partial_crossings_[{L, s, t, own}];
        if ((q + 1) % g_.chunk() == 0 || q + 1 == ts.size())
          ranks_[s].net[geo(s).net_partial_flag(own, q / g_.chunk())] = L;
      }
    }
  }

  // Note 6: the home rank sums its node's partials and the other nodes' rows.
  Agent home(uint32_t s, uint64_t L) {
    const uint32_t own = l_.node_of(s), world = l_.world(), k = g_.top_k;
    MK_AWAIT(yield(L));
    for (uint32_t t = 0; t < g_.tokens; ++t) {
      std::multiset<int32_t> sum;
      for (uint32_t j = 0; j < l_.gpus; ++j) {
        const uint32_t d = l_.rank_of(own, j);
        const uint32_t p = R(L, s).pos[size_t{t} * world + d];
        if (p == kMoeNoChoice) continue;
        MK_AWAIT(until(L, [this, s, j, own, p, L] {
              return flag(ranks_[s].nvl, geo(s).partial_flag(j, own, p / g_.chunk())) >= L;
            }, "partial chunk " + str(p / g_.chunk()) + " from local " + str(j)));
        const auto& part = read_partial(ranks_[s].partial[partial_index(j, own, p)], L, s, t,
                                        "rank " + str(s) + " partial region [" + str(j) + "][" + str(own) + "] position " + str(p));
        sum.insert(part.begin(), part.end());
      }
      for (uint32_t n = 0; n < l_.nodes; ++n) {
        const uint32_t q = R(L, s).npos[size_t{t} * l_.nodes + n];
        if (q == kMoeNoChoice) continue;
        MK_AWAIT(until(L, [this, s, n, q, L] { return flag(ranks_[s].net, geo(s).net_partial_flag(n, q / g_.chunk())) >= L; },
                            "network partial chunk " + str(q / g_.chunk()) + " from node " + str(n)));
        const auto& part = read_partial(ranks_[s].net_partial[net_index(n, q)], L, s, t,
                                        "rank " + str(s) + " network partial slot [" + str(n) + "] position " + str(q));
        sum.insert(part.begin(), part.end());
      }
      std::multiset<int32_t> want;
      const int32_t* ch = C(L, s, t);
      for (uint32_t j = 0; j < k; ++j)
        if (ch[j] >= 0) want.insert(ch[j]);
      check(sum == want, [&] {
        std::string got, exp;
        for (int32_t e : sum) got += " " + std::to_string(e);
        for (int32_t e : want) exp += " " + std::to_string(e);
        return "launch " + str(L) + " rank " + str(s) + " token " + str(t) + ": output sums experts{" + got +
               " }, expected{" + exp + " }";
      });
      if (t % 16 == 15) MK_AWAIT(yield(L));
    }
    // Every token reached every rank hosting one of its experts exactly once, and crossed the
    // network at most once per node (checked once per rank and launch, here at the end).
    for (uint32_t t = 0; t < g_.tokens; ++t) {
      const MoeRouting& Rs = R(L, s);
      for (uint32_t d = 0; d < world; ++d) {
        const bool want = Rs.pos[size_t{t} * world + d] != kMoeNoChoice;
        auto it = moved_.find({L, s, t, d});
        const uint32_t got = it == moved_.end() ? 0 : it->second;
        check(got == (want ? 1u : 0u), [&] {
          return "launch " + str(L) + ": token " + str(t) + " of rank " + str(s) + " reached rank " + str(d) + " " +
                 str(got) + " times, expected " + (want ? "1" : "0");
        });
      }
      for (uint32_t n = 0; n < l_.nodes; ++n) {
        auto it = net_crossings_.find({L, s, t, n});
        const uint32_t got = it == net_crossings_.end() ? 0 : it->second;
        check(n != own || got == 0, [&] { return "a token crossed the network to its own node"; });
        check(got <= 1, [&] { return "token " + str(t) + " of rank " + str(s) + " crossed the network to node " + str(n) + " " + str(got) + " times"; });
      }
    }
  }

  FusedLayout l_;
  MoeReplayOptions o_;
  MoeGeometry g_;
  std::mt19937_64 rng_;
  std::vector<Rank> ranks_;
  std::vector<Agent> agents_;
  std::vector<uint32_t> owners_;
  std::vector<std::string> names_;
  std::vector<std::vector<int32_t>> choices_;
  std::vector<MoeRouting> routing_;
  std::map<uint64_t, std::vector<std::vector<int32_t>>> saved_choices_;
  std::map<uint64_t, std::vector<MoeRouting>> saved_routing_;
  uint64_t routing_epoch_ = 0;
  std::map<uint64_t, uint32_t> last_dest_;
  std::map<std::tuple<uint64_t, uint32_t, uint32_t, uint32_t>, uint32_t> moved_, net_crossings_, net_partial_crossings_;
  uint64_t abort_launch_ = 0;
  std::string abort_cause_;
  MoeReplayReport rep_;
};

}  // namespace

#undef MK_AWAIT

MoeReplayReport moe_replay(const FusedLayout& layout, uint32_t tokens, uint32_t experts, uint32_t top_k,
                           const MoeReplayOptions& o) {
  Replay r(layout, tokens, experts, top_k, o);
  return r.run();
}

}  // namespace mkernel::kernels
