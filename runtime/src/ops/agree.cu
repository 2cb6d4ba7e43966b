// agree.cu: the agreement between ranks before a fused op is planned (agree.h).
#include "agree.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/comm.cuh"

namespace mkernel::rt {

namespace {

namespace mk = mkernel::kernels;

Status cuda_status(const char* what, cudaError_t e) {
  return Status(StatusCode::kDeviceError, std::string(what) + ": " + cudaGetErrorString(e));
}

// One block. Thread 0 sends this rank's words to every other rank into the agreement's bank
// (flag value: agree_flag_value(seq, word), so a later agreement's values are larger); every thread
// then waits for its share of the other ranks' words and reads each once (the value that
// satisfied the wait). table[q * W + i] gets rank q's word i; answered[q] = 1 when it came; when
// it did not, missing[q] = the word waited for and found[q] = the high half of what its flag held
// at the end (0: nothing yet; s + 1: agreement s's value), for the error message.
// A rank can be at most one agreement ahead of another (it needs the other's words to finish
// one), so two banks, alternating, keep a word from being overwritten before it was read.
__global__ void agree_kernel(mk::DeviceComm c, uint64_t seq, const uint32_t* mine, uint32_t words, uint32_t* table,
                             uint32_t* answered, uint32_t* missing, uint32_t* found, uint64_t timeout_ns,
                             uint32_t* push_failed) {
  const uint32_t bank = static_cast<uint32_t>(seq % mk::kAgreeBanks);
  if (threadIdx.x == 0) {
    for (uint32_t q = 0; q < c.world_size && *push_failed == 0; ++q) {
      if (q == c.rank) continue;
      for (uint32_t i = 0; i < words; ++i) {
        const uint32_t flag = mk::agree_flag_index(c, bank, c.rank, i);
        const uint64_t value = mk::agree_flag_value(seq, mine[i]);
        if (protocol::ring_push(c.ring, protocol::make_signal(q, flag, value, i)) != protocol::kRingOk) {
          *push_failed = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  // The waits record nothing in the status word: a rank that does not take part is the
  // caller's error to report, not a broken communicator (nor a failure mark, wait.cuh note 8,
  // that would end the waits of the op's launch).
  mk::WaitContext w = mk::wait_context(c);
  w.status = nullptr;
  w.host_gate = nullptr;
  w.failed = nullptr;
  w.timeout_ns = timeout_ns;
  for (uint32_t q = threadIdx.x; q < c.world_size; q += blockDim.x) {
    bool ok = true;
    for (uint32_t i = 0; i < words && ok; ++i) {
      if (q == c.rank) {
        table[q * mk::kAgreeWords + i] = mine[i];
        continue;
      }
      const uint64_t* f = c.flags + mk::agree_flag_index(c, bank, q, i);
      ok = mk::wait_geq(f, mk::agree_flag_floor(seq), w, 0, 0);
      const uint64_t v = sync::ld_acquire_sys(f);
      if (ok) {
        table[q * mk::kAgreeWords + i] = static_cast<uint32_t>(v & 0xFFFFFFFFu);
      } else {
        missing[q] = i;
        found[q] = static_cast<uint32_t>(v >> 32);
      }
    }
    answered[q] = ok ? 1u : 0u;
  }
}

}  // namespace

Status agree(Communicator& comm, const std::string& what, const std::vector<uint32_t>& words,
             const std::vector<std::string>& names, cudaStream_t stream) {
  const mk::DeviceComm& c = comm.device();
  const uint32_t W = static_cast<uint32_t>(words.size());
  if (W == 0 || W > mk::kAgreeWords || names.size() != words.size())
    return Status(StatusCode::kInternal, what + ": agreement of " + std::to_string(W) + " words");
  const uint64_t area = mk::agree_area_flags(c);
  if (c.num_fused_flags < area)
    return Status(StatusCode::kResourceExhausted,
                  what + ": the flag array has " + std::to_string(c.num_fused_flags) + " fused-op flags; agreeing needs " +
                      std::to_string(area) + " (" + std::to_string(mk::kAgreeWords * mk::kAgreeBanks) +
                      " per rank; Options::fused_flags)");
  MK_RETURN_IF_ERROR(comm.check().with_context(what + ": the communicator had already failed"));

  const uint32_t R = c.world_size;
  // Every rank agrees in the same order (each op's create), so the sequence numbers match.
  const uint64_t seq = comm.next_agreement();
  // mine, table, answered, missing, found, push_failed: the communicator's scratch, device and
  // pinned host (runtime.h says why neither is allocated here nor pageable). One agreement at a
  // time per communicator: each waits for its stream before it returns.
  const size_t count = W + size_t{R} * mk::kAgreeWords + 3 * size_t{R} + 1;
  if (count > Communicator::agreement_scratch_words(R) || comm.agreement_scratch() == nullptr ||
      comm.agreement_host_scratch() == nullptr)
    return Status(StatusCode::kInternal, what + ": the agreement scratch is missing or too small");
  uint32_t* host = comm.agreement_host_scratch();
  std::fill(host, host + count, 0u);
  std::copy(words.begin(), words.end(), host);
  uint32_t* dev = comm.agreement_scratch();
  auto run = [&]() -> Status {
    cudaError_t e = cudaMemcpyAsync(dev, host, count * sizeof(uint32_t), cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return cuda_status("cudaMemcpyAsync (agreement)", e);
    MK_RETURN_IF_ERROR(comm.begin_launch(stream));
    const uint64_t timeout_ns = static_cast<uint64_t>(comm.rendezvous_timeout().count()) * 1000000ull;
    uint32_t* answered = dev + W + size_t{R} * mk::kAgreeWords;
    agree_kernel<<<1, 128, 0, stream>>>(c, seq, dev, W, dev + W, answered, answered + R, answered + 2 * size_t{R},
                                        timeout_ns, dev + count - 1);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_status("agreement kernel launch", e);
    e = cudaMemcpyAsync(host, dev, count * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) return cuda_status("cudaMemcpyAsync (agreement)", e);
    return Status::Ok();
  };
  const Status launched = run();
  if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess && launched.ok())
    return cuda_status("agreement kernel", e);
  MK_RETURN_IF_ERROR(launched);
  MK_RETURN_IF_ERROR(comm.check().with_context(what));
  if (host[count - 1] != 0)
    return Status(StatusCode::kUnavailable, what + ": rank " + std::to_string(c.rank) +
                                                " could not push its agreement commands (ring full or stopped)");
  const uint32_t* table = host + W;
  const uint32_t* answered = table + size_t{R} * mk::kAgreeWords;
  const uint32_t* missing_word = answered + R;
  const uint32_t* found = missing_word + R;
  std::string missing, seen;
  for (uint32_t q = 0; q < R; ++q) {
    if (answered[q] != 0) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    // What the flag held says which side is behind: nothing (the words never came), or an
    // earlier agreement's (the ranks are not at the same agreement: a create() skipped on one).
    if (seen.size() < 400)
      seen += "; rank " + std::to_string(q) + "'s word " + std::to_string(missing_word[q]) + " holds " +
              (found[q] == 0 ? std::string("nothing yet")
                             : "agreement " + std::to_string(found[q] - 1) + "'s value");
  }
  if (!missing.empty())
    return Status(StatusCode::kDeadlineExceeded,
                  what + ": rank(s) " + missing + " did not take part within " +
                      std::to_string(comm.rendezvous_timeout().count()) +
                      " ms (every rank must create the op, with the same Options::num_flags; this rank is at "
                      "agreement " + std::to_string(seq) + seen + ")");
  for (uint32_t q = 0; q < R; ++q)
    for (uint32_t i = 0; i < W; ++i)
      if (table[q * mk::kAgreeWords + i] != words[i])
        return Status(StatusCode::kInvalidArgument,
                      what + ": ranks disagree on " + names[i] + ": rank " + std::to_string(q) + " has " +
                          std::to_string(table[q * mk::kAgreeWords + i]) + ", rank " + std::to_string(c.rank) +
                          " has " + std::to_string(words[i]));
  return Status::Ok();
}

}  // namespace mkernel::rt
