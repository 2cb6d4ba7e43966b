// agree.h: the ranks of a communicator agree on what they are about to do (a fused op's shape,
// layout and flag counts) before anything depends on it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/runtime/runtime.h"

namespace mkernel::rt {

// Collective: every rank calls it with the same number of words (at most kernels::kAgreeWords),
// named by `names`. Each rank leaves its words in every other rank's agreement flags through
// its proxy and reads theirs (one small kernel, bounded by the communicator's rendezvous
// timeout). Ok when every rank's words equal this rank's; otherwise the error names the first
// word that differs, with both values and ranks ("k: rank 0 has 8192, rank 1 has 4096"), or the
// ranks that did not take part in time. It is a launch of the communicator on `stream` (begin_
// launch, the kernel), stream-ordered after the caller's earlier launches there, and waits for
// that stream only (the communicator's scratch memory: no allocation, no device-wide
// synchronisation; other ranks of a process that share this GPU keep running).
Status agree(Communicator& comm, const std::string& what, const std::vector<uint32_t>& words,
             const std::vector<std::string>& names, cudaStream_t stream);

}  // namespace mkernel::rt
