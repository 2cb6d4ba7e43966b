// mkernel-raw-fabric-bench: the raw libfabric baseline for the proxy path. Writes of 4 KiB,
// 64 KiB and 1 MiB with fi_writedata from one process into another's registered buffer, a
// window of W in flight, on the provider the daemon's fabric transport would use.
//
// Design notes
//  1. One launcher forks a target; the parent is the initiator. Neither touches libfabric
//     before the fork. They talk over a socketpair: the target sends its endpoint name and the
//     key and base of its buffer, then the initiator drives every step (expect N writes / ready /
//     done) so a run never overlaps the next. Every wait on the socket, the CQ or the child has a
//     deadline; a write that never completes is an error exit, never a hang.
//  2. The libfabric setup is the one daemon/transport/fabric_transport.cc asks for: RDM,
//     FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG, modes FI_CONTEXT / FI_CONTEXT2 /
//     FI_RX_CQ_DATA (receives kept posted when the provider keeps the last), manual progress,
//     table AV, cq_data_size 8 then 4, FI_SOURCE and delivery-complete writes when offered, and
//     mr_mode FI_MR_LOCAL | VIRT_ADDR | ALLOCATED | PROV_KEY | ENDPOINT honoured as returned.
//  3. Write i goes from slot s of the initiator's buffer to slot s of the target's (slot =
//     bytes each, W slots), s being a slot whose previous write has completed; its CQ data is
//     i + 1 within the run. The target counts remote-CQ-data completions and checks that the
//     data values are exactly 1..N (count, sum and range).
//  4. Timing, as the proxy bench: from the first post to the initiator's last completion (with
//     delivery-complete writes: the data is in the target's memory). Runs are repeated; the
//     median run is reported. Before the warm-up of each size one write of a pattern is checked
//     byte for byte at the target.
//  5. Output: one JSON line per size on stdout, progress on stderr.
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// ---- errors ----------------------------------------------------------------------------------

// The first error of a role, with the call that failed; main prints it and exits non-zero.
struct Error {
  bool failed = false;
  std::string text;
  explicit operator bool() const { return failed; }
};
Error fail(std::string text) { return Error{true, std::move(text)}; }
Error fi_fail(const std::string& call, long ret) {
  const int err = static_cast<int>(ret < 0 ? -ret : ret);
  return fail(call + ": " + fi_strerror(err) + " (" + std::to_string(ret) + ")");
}
#define BENCH_TRY(expr)            \
  do {                             \
    Error bench_err_ = (expr);     \
    if (bench_err_) return bench_err_; \
  } while (0)

// ---- options ---------------------------------------------------------------------------------

struct Options {
  std::string provider = "tcp;ofi_rxm";
  std::string domain = "lo";  // "" = the provider's first
  std::vector<uint64_t> sizes = {4096, 65536, 1048576};
  uint32_t window = 16;
  uint32_t runs = 5;
  uint32_t warmup = 1;
  uint64_t ops = 0;                        // writes per run; 0 = from run_bytes
  uint64_t run_bytes = 128ull << 20;       // bytes per run when ops is 0 ...
  uint64_t min_ops = 1000, max_ops = 20000;  // ... clamped to this range
  bool fi_source = true;
  bool delivery_complete = true;
  // "anon": private anonymous pages; "memfd": shared memfd pages, the kind of memory a client
  // hands mkerneld for its regions (protocol/src/shm.cc).
  std::string memory = "anon";
  uint32_t timeout_ms = 10000;
};

uint64_t ops_for(const Options& o, uint64_t bytes) {
  if (o.ops != 0) return o.ops;
  return std::clamp<uint64_t>(o.run_bytes / bytes, o.min_ops, o.max_ops);
}

// ---- libfabric resources ----------------------------------------------------------------------

template <class T>
struct FidCloser {
  void operator()(T* object) const {
    if (object != nullptr) (void)fi_close(&object->fid);
  }
};
template <class T>
using Fid = std::unique_ptr<T, FidCloser<T>>;
struct InfoFree {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};

char* dup_c(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));  // fi_freeinfo frees with free()
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

std::string mr_mode_text(uint64_t m) {
  const std::pair<uint64_t, const char*> bits[] = {
      {FI_MR_LOCAL, "FI_MR_LOCAL"},         {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
      {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"}, {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
      {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},   {FI_MR_RAW, "FI_MR_RAW"},
      {FI_MR_HMEM, "FI_MR_HMEM"}};
  std::string out;
  for (const auto& [bit, name] : bits) {
    if ((m & bit) != 0) out += (out.empty() ? "" : "|") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

// One operation context: FI_CONTEXT2 mode lends the first bytes to the provider.
struct OpContext {
  fi_context2 ctx;
  uint32_t slot;
  bool is_receive;
};
static_assert(offsetof(OpContext, ctx) == 0);

// Page-aligned mapped memory (FI_MR_ALLOCATED wants mapped memory; pages keep slots aligned):
// private anonymous pages, or shared pages of a memfd like the regions clients give mkerneld.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  Error allocate(size_t size, const std::string& memory) {
    void* p = MAP_FAILED;
    if (memory == "memfd") {
      const int fd = memfd_create("raw-fabric-bench", MFD_CLOEXEC);
      if (fd < 0) return fail(std::string("memfd_create: ") + std::strerror(errno));
      if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
        p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      close(fd);  // the mapping keeps the memory
    } else {
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) return fail("mmap " + std::to_string(size) + " bytes: " + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
    size_ = size;
    std::memset(data_, 0, size_);  // touch every page before registering and timing
    return {};
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One endpoint with its CQ and AV. Members in creation order, destroyed in reverse.
class Endpoint {
 public:
  Error open(const Options& o);
  // Registers [addr, addr+len) with `access`; returns key and descriptor.
  Error register_buffer(void* addr, size_t len, uint64_t access, uint64_t* key, void** desc);
  Error post_receives(size_t n);
  // Reads up to 16 entries; returns count, 0 when empty; an error entry is an Error.
  Error read_cq(std::array<fi_cq_data_entry, 16>* entries, size_t* got);

  fi_info* info() const { return info_.get(); }
  fid_ep* ep() const { return ep_.get(); }
  fid_av* av() const { return av_.get(); }
  bool rx_cq_data() const { return (info_->mode & FI_RX_CQ_DATA) != 0; }
  bool delivery_complete() const { return (info_->tx_attr->op_flags & FI_DELIVERY_COMPLETE) != 0; }
  bool fi_source() const { return (info_->caps & FI_SOURCE) != 0; }
  std::vector<uint8_t> name() const { return name_; }

 private:
  std::unique_ptr<fi_info, InfoFree> info_;
  Fid<fid_fabric> fabric_;
  Fid<fid_domain> domain_;
  Fid<fid_cq> cq_;
  Fid<fid_av> av_;
  Fid<fid_ep> ep_;
  std::vector<Fid<fid_mr>> mrs_;
  std::vector<OpContext> receives_;
  std::vector<uint8_t> name_;
  std::mt19937_64 key_rng_{std::random_device{}()};
};

Error Endpoint::open(const Options& o) {
  struct Attempt {
    uint64_t caps;
    size_t cq_data;
    uint64_t op_flags;
  };
  const Attempt attempts[] = {{FI_SOURCE, 8, FI_DELIVERY_COMPLETE}, {FI_SOURCE, 4, FI_DELIVERY_COMPLETE},
                              {0, 8, FI_DELIVERY_COMPLETE},         {0, 4, FI_DELIVERY_COMPLETE},
                              {FI_SOURCE, 8, 0},                    {FI_SOURCE, 4, 0},
                              {0, 8, 0},                            {0, 4, 0}};
  int last = -FI_ENODATA;
  for (const Attempt& a : attempts) {
    if (!o.fi_source && a.caps == FI_SOURCE) continue;
    if (!o.delivery_complete && a.op_flags != 0) continue;
    std::unique_ptr<fi_info, InfoFree> hints(fi_allocinfo());
    if (!hints) return fail("fi_allocinfo failed");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_SEND | FI_RECV | a.caps;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->cq_data_size = a.cq_data;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->av_type = FI_AV_TABLE;
    hints->tx_attr->op_flags = a.op_flags;
    hints->fabric_attr->prov_name = dup_c(o.provider);
    if (!o.domain.empty()) hints->domain_attr->name = dup_c(o.domain);
    fi_info* found = nullptr;
    last = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0,
                      hints.get(), &found);
    if (last != 0 || found == nullptr) continue;
    // Layered providers (tcp;ofi_rxm) do not filter on the domain name.
    fi_info* pick = nullptr;
    for (fi_info* it = found; it != nullptr && pick == nullptr; it = it->next) {
      if (o.domain.empty() || (it->domain_attr->name != nullptr && o.domain == it->domain_attr->name)) {
        pick = it;
      }
    }
    if (pick != nullptr) info_.reset(fi_dupinfo(pick));
    fi_freeinfo(found);
    if (pick == nullptr) return fail("provider '" + o.provider + "' has no domain '" + o.domain + "'");
    if (!info_) return fail("fi_dupinfo failed");
    break;
  }
  if (!info_) return fi_fail("fi_getinfo(" + o.provider + ")", last);
  if ((info_->domain_attr->mr_mode & FI_MR_RAW) != 0) return fail("provider wants FI_MR_RAW keys");

  fid_fabric* fabric = nullptr;
  int ret = fi_fabric(info_->fabric_attr, &fabric, nullptr);
  if (ret != 0) return fi_fail("fi_fabric", ret);
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  ret = fi_domain(fabric_.get(), info_.get(), &domain, nullptr);
  if (ret != 0) return fi_fail("fi_domain", ret);
  domain_.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = 4096;
  fid_cq* cq = nullptr;
  ret = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr);
  if (ret != 0) return fi_fail("fi_cq_open", ret);
  cq_.reset(cq);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 4;
  fid_av* av = nullptr;
  ret = fi_av_open(domain_.get(), &av_attr, &av, nullptr);
  if (ret != 0) return fi_fail("fi_av_open", ret);
  av_.reset(av);
  fid_ep* ep = nullptr;
  ret = fi_endpoint(domain_.get(), info_.get(), &ep, nullptr);
  if (ret != 0) return fi_fail("fi_endpoint", ret);
  ep_.reset(ep);
  ret = fi_ep_bind(ep_.get(), &av_->fid, 0);
  if (ret != 0) return fi_fail("fi_ep_bind(av)", ret);
  ret = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) return fi_fail("fi_ep_bind(cq)", ret);
  ret = fi_enable(ep_.get());
  if (ret != 0) return fi_fail("fi_enable", ret);
  std::array<uint8_t, 1024> name{};
  size_t len = name.size();
  ret = fi_getname(&ep_->fid, name.data(), &len);
  if (ret != 0) return fi_fail("fi_getname", ret);
  name_.assign(name.begin(), name.begin() + static_cast<std::ptrdiff_t>(len));
  return {};
}

Error Endpoint::register_buffer(void* addr, size_t len, uint64_t access, uint64_t* key, void** desc) {
  const uint64_t mr_mode = info_->domain_attr->mr_mode;
  const size_t key_bytes = std::clamp<size_t>(info_->domain_attr->mr_key_size, 1, 8);
  const uint64_t key_mask = key_bytes >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * key_bytes)) - 1;
  fid_mr* mr = nullptr;
  int ret = -FI_ENOKEY;
  for (int attempt = 0; attempt < 8 && ret == -FI_ENOKEY; ++attempt) {
    uint64_t requested = 0;
    if ((mr_mode & FI_MR_PROV_KEY) == 0) requested = std::max<uint64_t>(1, key_rng_() & key_mask);
    ret = fi_mr_reg(domain_.get(), addr, len, access, 0, requested, 0, &mr, nullptr);
  }
  if (ret != 0) return fi_fail("fi_mr_reg", ret);
  mrs_.emplace_back(mr);
  if ((mr_mode & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(mr, &ep_->fid, 0);
    if (ret != 0) return fi_fail("fi_mr_bind", ret);
    ret = fi_mr_enable(mr);
    if (ret != 0) return fi_fail("fi_mr_enable", ret);
  }
  *key = fi_mr_key(mr);
  if (*key == FI_KEY_NOTAVAIL) return fail("fi_mr_key: no 64-bit key");
  *desc = fi_mr_desc(mr);
  return {};
}

Error Endpoint::post_receives(size_t n) {
  receives_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    receives_[i] = OpContext{};
    receives_[i].is_receive = true;
    const ssize_t ret = fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &receives_[i].ctx);
    if (ret != 0) return fi_fail("fi_recv", ret);
  }
  return {};
}

Error Endpoint::read_cq(std::array<fi_cq_data_entry, 16>* entries, size_t* got) {
  *got = 0;
  // As the transport: with FI_SOURCE the CQ is read with fi_cq_readfrom.
  std::array<fi_addr_t, 16> sources{};
  const ssize_t n = fi_source() ? fi_cq_readfrom(cq_.get(), entries->data(), entries->size(), sources.data())
                                : fi_cq_read(cq_.get(), entries->data(), entries->size());
  if (n > 0) {
    *got = static_cast<size_t>(n);
    // A receive consumed by remote CQ data (FI_RX_CQ_DATA providers) goes back at once.
    for (size_t i = 0; i < *got; ++i) {
      auto* c = static_cast<OpContext*>((*entries)[i].op_context);
      if (c != nullptr && c->is_receive) {
        const ssize_t ret = fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &c->ctx);
        if (ret != 0) return fi_fail("fi_recv (re-post)", ret);
      }
    }
    return {};
  }
  if (n == -FI_EAGAIN) return {};
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq_.get(), &err, 0) != 1) return fail("fi_cq_readerr failed");
    char reason[256] = {};
    const char* text = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, reason, sizeof(reason));
    return fail(std::string("completion error: ") + fi_strerror(err.err) + " (provider: " +
                (text != nullptr ? text : "?") + ")");
  }
  return fi_fail("fi_cq_read", n);
}

// ---- the launcher's channel -------------------------------------------------------------------

enum MsgType : uint32_t { kHello = 1, kExpect, kReady, kDone, kQuit, kFailed };

struct Msg {
  uint32_t type = 0;
  uint32_t name_len = 0;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  std::array<char, 1024> text{};  // endpoint name (hello) or an error (failed)
};

Error send_msg(int fd, const Msg& m) {
  if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(m))) {
    return fail(std::string("send to the other process: ") + std::strerror(errno));
  }
  return {};
}

Error recv_msg(int fd, Msg* m, std::chrono::milliseconds bound, const char* waiting_for) {
  pollfd p{fd, POLLIN, 0};
  const int ready = poll(&p, 1, static_cast<int>(bound.count()));
  if (ready == 0) return fail(std::string("no ") + waiting_for + " from the other process within " +
                              std::to_string(bound.count()) + " ms");
  if (ready < 0) return fail(std::string("poll: ") + std::strerror(errno));
  const ssize_t n = recv(fd, m, sizeof(*m), 0);
  if (n != static_cast<ssize_t>(sizeof(*m))) return fail(std::string("the other process left while waiting for ") + waiting_for);
  if (m->type == kFailed) return fail(std::string("other process failed: ") + m->text.data());
  return {};
}

void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(p + i, &w, std::min<size_t>(8, n - i));
  }
}

// ---- target -----------------------------------------------------------------------------------

Error run_target(const Options& o, int fd) {
  Endpoint ep;
  BENCH_TRY(ep.open(o));
  const uint64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  Buffer buf;
  BENCH_TRY(buf.allocate(max_bytes * o.window, o.memory));
  uint64_t key = 0;
  void* desc = nullptr;
  BENCH_TRY(ep.register_buffer(buf.data(), buf.size(), FI_REMOTE_WRITE | FI_WRITE, &key, &desc));
  if (ep.rx_cq_data()) BENCH_TRY(ep.post_receives(256));

  Msg hello;
  hello.type = kHello;
  const std::vector<uint8_t> name = ep.name();
  hello.name_len = static_cast<uint32_t>(name.size());
  std::memcpy(hello.text.data(), name.data(), name.size());
  hello.a = key;
  hello.b = (ep.info()->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uintptr_t>(buf.data()) : 0;
  hello.c = ep.info()->domain_attr->cq_data_size;
  BENCH_TRY(send_msg(fd, hello));

  const auto bound = std::chrono::milliseconds(o.timeout_ms);
  std::array<fi_cq_data_entry, 16> entries{};
  for (;;) {
    Msg m;
    // The initiator sets up its endpoint and checks patterns between steps: wait generously.
    BENCH_TRY(recv_msg(fd, &m, bound * 6, "next step"));
    if (m.type == kQuit) return {};
    if (m.type != kExpect) return fail("unexpected message " + std::to_string(m.type));
    const uint64_t expect = m.a, verify_bytes = m.b, seed = m.c;
    Msg ready;
    ready.type = kReady;
    BENCH_TRY(send_msg(fd, ready));
    uint64_t arrivals = 0, sum = 0, out_of_range = 0;
    auto deadline = Clock::now() + bound;
    while (arrivals < expect) {
      size_t got = 0;
      BENCH_TRY(ep.read_cq(&entries, &got));
      for (size_t i = 0; i < got; ++i) {
        if ((entries[i].flags & FI_REMOTE_CQ_DATA) == 0) continue;
        ++arrivals;
        sum += entries[i].data;
        if (entries[i].data == 0 || entries[i].data > expect) ++out_of_range;
      }
      if (got > 0) {
        deadline = Clock::now() + bound;
      } else if (Clock::now() > deadline) {
        return fail("target: " + std::to_string(arrivals) + " of " + std::to_string(expect) +
                    " writes arrived; none for " + std::to_string(o.timeout_ms) + " ms");
      }
    }
    Msg done;
    done.type = kDone;
    done.a = arrivals;
    done.b = (sum == expect * (expect + 1) / 2 && out_of_range == 0) ? 1 : 0;
    done.c = 1;
    if (verify_bytes > 0) {
      std::vector<uint8_t> want(verify_bytes);
      fill_pattern(want.data(), want.size(), seed);
      done.c = std::memcmp(want.data(), buf.data(), verify_bytes) == 0 ? 1 : 0;
    }
    BENCH_TRY(send_msg(fd, done));
  }
}

// ---- initiator --------------------------------------------------------------------------------

struct Peer {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  uint64_t key = 0;
  uint64_t base = 0;
};

// Posts `count` writes of `bytes` with `window` in flight; CQ data 1..count. Returns seconds.
Error run_writes(const Options& o, Endpoint& ep, const Peer& peer, uint8_t* src, void* src_desc,
                 uint64_t bytes, uint64_t count, uint32_t window, double* seconds) {
  std::vector<OpContext> ctx(window);
  std::vector<uint32_t> free_slots;
  for (uint32_t s = window; s > 0; --s) free_slots.push_back(s - 1);
  std::array<fi_cq_data_entry, 16> entries{};
  const auto bound = std::chrono::milliseconds(o.timeout_ms);
  uint64_t posted = 0, completed = 0;
  const auto t0 = Clock::now();
  auto deadline = t0 + bound;
  while (completed < count) {
    bool progressed = false;
    while (posted < count && !free_slots.empty()) {
      const uint32_t slot = free_slots.back();
      ctx[slot] = OpContext{};
      ctx[slot].slot = slot;
      const ssize_t ret = fi_writedata(ep.ep(), src + slot * bytes, bytes, src_desc, posted + 1,
                                       peer.addr, peer.base + slot * bytes, peer.key, &ctx[slot].ctx);
      if (ret == -FI_EAGAIN) break;  // queue full: read the CQ, then retry
      if (ret != 0) return fi_fail("fi_writedata", ret);
      free_slots.pop_back();
      ++posted;
      progressed = true;
    }
    size_t got = 0;
    BENCH_TRY(ep.read_cq(&entries, &got));
    for (size_t i = 0; i < got; ++i) {
      auto* c = static_cast<OpContext*>(entries[i].op_context);
      if (c == nullptr || c->is_receive) continue;
      free_slots.push_back(c->slot);
      ++completed;
      progressed = true;
    }
    if (progressed) {
      deadline = Clock::now() + bound;
    } else if (Clock::now() > deadline) {
      return fail("initiator: " + std::to_string(completed) + " of " + std::to_string(count) +
                  " writes of " + std::to_string(bytes) + " bytes completed (" +
                  std::to_string(posted) + " posted); nothing for " + std::to_string(o.timeout_ms) + " ms");
    }
  }
  *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return {};
}

// One step: tell the target what to expect, run the writes, collect its verdict.
Error step(const Options& o, int fd, Endpoint& ep, const Peer& peer, uint8_t* src, void* desc,
           uint64_t bytes, uint64_t count, uint32_t window, uint64_t verify_seed, double* seconds) {
  const auto bound = std::chrono::milliseconds(o.timeout_ms);
  Msg expect;
  expect.type = kExpect;
  expect.a = count;
  expect.b = verify_seed != 0 ? bytes : 0;
  expect.c = verify_seed;
  BENCH_TRY(send_msg(fd, expect));
  Msg m;
  BENCH_TRY(recv_msg(fd, &m, bound, "ready"));
  BENCH_TRY(run_writes(o, ep, peer, src, desc, bytes, count, window, seconds));
  BENCH_TRY(recv_msg(fd, &m, bound, "done"));
  if (m.type != kDone) return fail("expected done, got message " + std::to_string(m.type));
  if (m.a != count || m.b != 1) {
    return fail("target saw " + std::to_string(m.a) + " of " + std::to_string(count) +
                " remote CQ data entries" + (m.b != 1 ? " with wrong data values" : ""));
  }
  if (m.c != 1) return fail("target: the " + std::to_string(bytes) + "-byte pattern arrived wrong");
  return {};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Error run_initiator(const Options& o, int fd) {
  Endpoint ep;
  BENCH_TRY(ep.open(o));
  Msg hello;
  BENCH_TRY(recv_msg(fd, &hello, std::chrono::milliseconds(o.timeout_ms), "hello"));
  if (hello.type != kHello) return fail("expected hello");
  if (hello.c != ep.info()->domain_attr->cq_data_size) return fail("target and initiator differ in cq_data_size");
  Peer peer;
  peer.key = hello.a;
  peer.base = hello.b;
  if (fi_av_insert(ep.av(), hello.text.data(), 1, &peer.addr, 0, nullptr) != 1) {
    return fail("fi_av_insert: the target's address was not accepted");
  }
  if (ep.rx_cq_data()) BENCH_TRY(ep.post_receives(16));
  const uint64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  Buffer src;
  BENCH_TRY(src.allocate(max_bytes * o.window, o.memory));
  uint64_t src_key = 0;
  void* src_desc = nullptr;
  BENCH_TRY(ep.register_buffer(src.data(), src.size(), FI_WRITE, &src_key, &src_desc));

  const fi_info* info = ep.info();
  const std::string lib = std::to_string(FI_MAJOR(fi_version())) + "." + std::to_string(FI_MINOR(fi_version()));
  std::fprintf(stderr, "raw: provider %s, domain %s, libfabric %s, mr_mode %s, cq_data %zu, %s completion, FI_SOURCE %s%s\n",
               info->fabric_attr->prov_name, info->domain_attr->name, lib.c_str(),
               mr_mode_text(info->domain_attr->mr_mode).c_str(), info->domain_attr->cq_data_size,
               ep.delivery_complete() ? "delivery" : "transmit", ep.fi_source() ? "yes" : "no",
               ep.rx_cq_data() ? ", FI_RX_CQ_DATA" : "");

  for (const uint64_t bytes : o.sizes) {
    const uint64_t count = ops_for(o, bytes);
    double secs = 0;
    // Byte check: one write of a pattern into slot 0, window 1.
    fill_pattern(src.data(), bytes, bytes * 7919 + 1);
    BENCH_TRY(step(o, fd, ep, peer, src.data(), src_desc, bytes, 1, 1, bytes * 7919 + 1, &secs));
    for (uint32_t w = 0; w < o.warmup; ++w) {
      BENCH_TRY(step(o, fd, ep, peer, src.data(), src_desc, bytes, count, o.window, 0, &secs));
    }
    std::vector<double> gbps, opsps;
    for (uint32_t r = 0; r < o.runs; ++r) {
      BENCH_TRY(step(o, fd, ep, peer, src.data(), src_desc, bytes, count, o.window, 0, &secs));
      gbps.push_back(static_cast<double>(bytes * count) / secs / 1e9);
      opsps.push_back(static_cast<double>(count) / secs);
    }
    const double med = median(gbps);
    std::fprintf(stderr, "raw %s %8llu B x %llu, window %u: %.3f GB/s median (min %.3f, max %.3f), %.0f ops/s\n",
                 o.provider.c_str(), static_cast<unsigned long long>(bytes),
                 static_cast<unsigned long long>(count), o.window, med,
                 *std::min_element(gbps.begin(), gbps.end()), *std::max_element(gbps.begin(), gbps.end()),
                 median(opsps));
    std::printf(
        "{\"bench\": \"raw_fi_writedata\", \"provider\": \"%s\", \"domain\": \"%s\", "
        "\"libfabric\": \"%s\", \"bytes\": %llu, \"window\": %u, \"ops_per_run\": %llu, "
        "\"runs\": %u, \"ops_per_s\": %.1f, \"gbytes_per_s\": %.4f, \"gbytes_per_s_min\": %.4f, "
        "\"gbytes_per_s_max\": %.4f, \"median_s\": %.6f, \"completion\": \"%s\", \"mr_mode\": \"%s\", "
        "\"fi_source\": %s, \"cq_data_size\": %zu, \"memory\": \"%s\"}\n",
        info->fabric_attr->prov_name, info->domain_attr->name, lib.c_str(),
        static_cast<unsigned long long>(bytes), o.window, static_cast<unsigned long long>(count),
        o.runs, median(opsps), med, *std::min_element(gbps.begin(), gbps.end()),
        *std::max_element(gbps.begin(), gbps.end()), static_cast<double>(bytes * count) / med / 1e9,
        ep.delivery_complete() ? "delivery" : "transmit", mr_mode_text(info->domain_attr->mr_mode).c_str(),
        ep.fi_source() ? "true" : "false", info->domain_attr->cq_data_size, o.memory.c_str());
    std::fflush(stdout);
  }
  Msg quit;
  quit.type = kQuit;
  return send_msg(fd, quit);
}

// Waits up to `bound` for the child; kills it after that. Returns its exit code (or -1).
int reap(pid_t child, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    if (Clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return -1;
    }
    usleep(10000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"mkernel-raw-fabric-bench: fi_writedata between two processes, the baseline for "
               "the proxy path (one JSON line per size on stdout)"};
  app.add_option("--provider", o.provider, "libfabric provider: \"tcp;ofi_rxm\" or \"shm\"");
  app.add_option("--domain", o.domain, "domain (NIC) name; \"\" = the provider's first (use \"\" for shm)");
  app.add_option("--sizes", o.sizes, "write sizes in bytes")->delimiter(',')->check(CLI::Range(uint64_t{8}, uint64_t{1} << 30));
  app.add_option("--window", o.window, "writes in flight")->check(CLI::Range(1, 4096));
  app.add_option("--runs", o.runs, "timed runs per size (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", o.warmup, "untimed runs per size first");
  app.add_option("--ops", o.ops, "writes per run (default: --run-bytes / size within [1000, 20000])");
  app.add_option("--run-bytes", o.run_bytes, "bytes per run when --ops is not given");
  app.add_option("--timeout-ms", o.timeout_ms, "longest wait for any progress")->check(CLI::Range(100, 600000));
  app.add_flag("!--no-fi-source", o.fi_source, "do not ask for FI_SOURCE (the transport asks for it)");
  app.add_option("--memory", o.memory, "buffers: anon (private anonymous pages) or memfd (shared, as mkerneld's regions)")
      ->check(CLI::IsMember({"anon", "memfd"}));
  app.add_flag("!--no-delivery-complete", o.delivery_complete,
               "do not ask for FI_DELIVERY_COMPLETE writes (the transport asks for them)");
  CLI11_PARSE(app, argc, argv);
  if (o.provider == "shm" && o.domain == "lo") o.domain = "";

  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("socketpair");
    return 2;
  }
  // Fork before anything touches libfabric.
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 2;
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[0]);
    const Error e = run_target(o, fds[1]);
    if (e) {
      std::fprintf(stderr, "mkernel-raw-fabric-bench target: %s\n", e.text.c_str());
      Msg m;
      m.type = kFailed;
      std::snprintf(m.text.data(), m.text.size(), "%s", e.text.c_str());
      (void)send_msg(fds[1], m);
    }
    std::fflush(stderr);
    _exit(e ? 1 : 0);
  }
  close(fds[1]);
  const Error e = run_initiator(o, fds[0]);
  if (e) std::fprintf(stderr, "mkernel-raw-fabric-bench: %s\n", e.text.c_str());
  close(fds[0]);
  const int child_rc = reap(child, e ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(o.timeout_ms));
  if (!e && child_rc != 0) std::fprintf(stderr, "mkernel-raw-fabric-bench: target exited with %d\n", child_rc);
  return (e || child_rc != 0) ? 1 : 0;
}
