// sm90_attention_params.h: the plain-data parameters of the attention core, shared by its device
// code (sm90_attention.cuh) and its host launcher (sm90_attention.cu), and by the fused ring kernel
// that will call the core once per key/value chunk.
//
// Design notes
//  1. A *unit* is one 128-row tile of queries of one (batch, query head): the core's grain of
//     work. Units are ordered and handed out in one of three ways, fixed for a launch (note 4):
//       kAttnHeadMajor  all m blocks of one head together, last m block first, dealt round-robin
//                       to the persistent blocks: the blocks in flight share one or two heads' K
//                       and V in L2. Without a causal mask every unit costs the same and this is
//                       all it needs;
//       kAttnCostSnake  sorted by cost (the last m block of every head first, then the one
//                       before, ...), dealt back and forth (block b takes positions b, 2G-1-b,
//                       2G+b, ... of G blocks): balanced, but the blocks in flight read every
//                       head's K and V, which cost up to 14% in L2 misses when measured;
//       kAttnDynamic    bands of two heads, within a band sorted by cost (last m blocks first),
//                       taken by the blocks as they free up (the first unit of a block is its
//                       index, the next ones come from an atomic counter in the workspace, reset
//                       by the last block to finish): a causal launch balanced to 0.999 of its
//                       work (replay of the schedule; head-major round-robin gave 0.93-0.97)
//                       with the L2 locality of head-major. One chunk only (note 4).
//     The producer of each block decides the units and announces each to its consumers through a
//     two-slot channel in shared memory (Sm90AttnCore::announce / receive); attn_unit() and
//     attn_unit_index() are the one place the numbering lives.
//  2. A *chunk* is one span of keys and values (the whole sequence for the standalone op; the
//     chunk a ring step holds for the fused op) and how the query tile relates to it:
//       kAttnFull   every query sees every key of the chunk;
//       kAttnCausal query row i sees key j iff j <= i + causal_offset (chunk-local indices);
//                   only the key blocks that cross that diagonal, and a last partial block, are
//                   masked element by element;
//       kAttnSkip   no key is visible (a ring step whose keys all lie in this rank's future).
//  3. What a unit does with its result over one chunk (flags):
//       none                      write the running state: O (fp32, normalised) and lse (fp32);
//       kAttnReadRunning          merge with the running state first (online-softmax merge in fp32);
//       kAttnWriteFinal           write O (bf16, through shared memory and TMA) and lse to the outputs
//                                 instead of the running state.
//     The standalone op is one chunk with kAttnWriteFinal; a ring of R steps is chunk 0 with no
//     flag, steps 1..R-2 with kAttnReadRunning, step R-1 with both.
//  4. The running state of a unit is read and written only by the consumer thread that owns the
//     fragment element, and a unit is owned by the same block in every chunk (a static schedule,
//     note 1, fixed for the launch), so chunks need no synchronisation between blocks.
//  5. Rows with no visible key (a skipped chunk, or a causal offset below zero) have lse = -inf and
//     O = 0; merging such a partial changes nothing.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/wait.cuh"

namespace mkernel::kernels {

enum AttnRelation : uint32_t {
  kAttnFull = 0,
  kAttnCausal = 1,
  kAttnSkip = 2,
};

enum AttnUnitOrder : uint32_t {
  kAttnHeadMajor = 0,
  kAttnCostSnake = 1,
  kAttnDynamic = 2,
};

enum AttnChunkFlags : uint32_t {
  kAttnReadRunning = 1,
  kAttnWriteFinal = 2,
};

// The most chunks one launch of the standalone kernel takes (tensor maps travel as kernel
// parameters). The ring kernel passes its own chunks and is not bound by this.
inline constexpr int kAttnMaxChunks = 4;

struct AttnChunk {
  uint32_t kv_len;        // keys in this chunk
  uint32_t relation;      // AttnRelation
  int32_t causal_offset;  // kAttnCausal: row i sees key j iff j <= i + causal_offset
  uint32_t flags;         // AttnChunkFlags
};

struct AttnParams {
  // Problem (note 1). Q and O: [batch, heads_q, q_len, head_dim] as TMA tensor maps (any strides);
  // K and V: [batch, heads_kv, kv_len, head_dim]; query head h reads key/value head h / group.
  uint32_t batch, heads_q, heads_kv, group;
  uint32_t q_len;
  uint32_t num_m_blocks;  // ceil(q_len / 128)
  uint32_t num_units;     // batch * heads_q * num_m_blocks
  uint32_t unit_order;    // AttnUnitOrder (note 1)
  float scale;            // softmax scale (1/sqrt(head_dim) unless given)
  float scale_log2;       // scale * log2(e): exponentials are exp2 of fused multiply-adds

  // Outputs. lse: fp32 [batch, heads_q, lse_head_stride] (natural log), written with kAttnWriteFinal:
  // row i of head (b, h) at lse[(b * heads_q + h) * lse_head_stride + i]. The standalone op's
  // lse_head_stride is q_len; the ring's query groups are rows of a longer sequence.
  float* lse;
  uint32_t lse_head_stride;
  // Running state (note 3; only chunks without kAttnWriteFinal, or with kAttnReadRunning, use it):
  // fp32 [batch, heads_q, q_len, head_dim] and [batch, heads_q, q_len], packed.
  float* o_run;
  float* lse_run;
  // kAttnDynamic: [0] next unit - grid, [1] blocks done; zero before a launch, zero after it.
  uint32_t* sched_counters;

  uint32_t num_chunks;
  AttnChunk chunks[kAttnMaxChunks];

  // Errors: where the first error goes and the bound on every pipeline wait (common/wait.cuh).
  WaitContext wait;
  // Test hook: bit 0 swaps the two byte offsets of V's shared-memory descriptor (a wrong layout
  // must show up as a failed comparison, which is what the GPU test checks). 0 in real use.
  uint32_t debug;
};

// Tensor maps of one launch of the standalone kernel, passed by value (__grid_constant__).
struct AttnMaps {
  CUtensorMap q;                  // box {64, 128, 1, 1}: one 64-column slice of a 128-row tile
  CUtensorMap o;                  // box {64, 64, 1, 1}: one consumer's 64 rows, 64 columns
  CUtensorMap k[kAttnMaxChunks];  // box {64, BLOCK_N, 1, 1}
  CUtensorMap v[kAttnMaxChunks];  // box {64, BLOCK_N, 1, 1}
};

}  // namespace mkernel::kernels
