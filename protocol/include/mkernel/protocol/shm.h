// shm.h: shared memory segments for rings, regions and flags: memfd files the daemon creates and
// seals, and the mappings both sides hold.
//
// The daemon creates every segment (create_sealed_segment): a memfd sized once and sealed
// against shrinking, growing and further sealing, so a client cannot pull pages out from under
// the daemon (a shrunk mapping would fault in the proxy). A receiver maps a segment with the
// size the descriptor reports (map_segment), never with a size from a message.
#pragma once

#include <cstddef>
#include <string>

#include "mkernel/common/status.h"
#include "mkernel/protocol/session_wire.h"

namespace mkernel::protocol {

class SharedMapping {
 public:
  SharedMapping() = default;
  SharedMapping(UniqueFd fd, void* addr, size_t bytes) : fd_(std::move(fd)), addr_(addr), bytes_(bytes) {}
  ~SharedMapping();
  SharedMapping(SharedMapping&& o) noexcept;
  SharedMapping& operator=(SharedMapping&& o) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  void* data() const { return addr_; }
  size_t size() const { return bytes_; }
  int fd() const { return fd_.get(); }
  // Hands the descriptor over and keeps the mapping: a mapping outlives its descriptor, so the
  // daemon closes a segment's descriptor once the client has its copy and holds none for it.
  UniqueFd release_fd() { return std::move(fd_); }

 private:
  void unmap();
  UniqueFd fd_;
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

// Creates a zero-filled memfd segment of `bytes` (rounded up to whole pages), seals it and maps
// it read-write. kResourceExhausted when the process (or the system) has no descriptor left.
StatusOr<SharedMapping> create_sealed_segment(const std::string& name, size_t bytes);

// Maps a segment received from a peer. `expected_bytes` of 0 accepts any size; otherwise the
// descriptor's size must equal it. `require_seals` checks that shrinking is sealed.
StatusOr<SharedMapping> map_segment(UniqueFd fd, size_t expected_bytes, bool require_seals);

size_t page_round_up(size_t bytes);

}  // namespace mkernel::protocol
