// dmabuf.h: what the daemon checks about a dmabuf descriptor a client hands it for a GPU-memory
// region (ImportRegion), before any transport sees it.
//
// The kernel describes every open dmabuf in /proc/self/fdinfo/<fd>: "size:" (bytes) and
// "exp_name:" (the exporting driver: "nvidia" for CUDA allocations). A descriptor whose fdinfo
// has no exp_name is not a dmabuf (a memfd, a file, a socket) and is refused, naming what it is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mkernel/common/status.h"

namespace mkernel::daemon {

struct DmabufInfo {
  std::string exporter;  // exp_name
  uint64_t size = 0;     // bytes
};

// Parses fdinfo text. `what` names the descriptor in errors ("the descriptor (/memfd:x)").
StatusOr<DmabufInfo> parse_dmabuf_fdinfo(std::string_view fdinfo, const std::string& what);

// Reads /proc/self/fdinfo/<fd> (and /proc/self/fd/<fd> to name a wrong kind of descriptor).
StatusOr<DmabufInfo> inspect_dmabuf(int fd);

}  // namespace mkernel::daemon
