#include "dmabuf.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include "mkernel/protocol/shm.h"

namespace mkernel::daemon {

namespace {

// Finds "key:<blanks>value" at the start of a line; true and the value when present.
bool field(std::string_view text, std::string_view key, std::string_view* value) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ':') {
      std::string_view v = line.substr(key.size() + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
      *value = v;
      return true;
    }
    pos = end + 1;
  }
  return false;
}

}  // namespace

StatusOr<DmabufInfo> parse_dmabuf_fdinfo(std::string_view fdinfo, const std::string& what) {
  std::string_view exp, size;
  if (!field(fdinfo, "exp_name", &exp))
    return Status(StatusCode::kInvalidArgument,
                  "dmabuf descriptor: " + what +
                      " is not a dmabuf (its fdinfo has no exp_name); expected the descriptor "
                      "cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) returns");
  if (!field(fdinfo, "size", &size))
    return Status(StatusCode::kInvalidArgument, "dmabuf descriptor: " + what + " (exporter \"" + std::string(exp) +
                                                    "\") reports no size in its fdinfo");
  DmabufInfo info;
  info.exporter = std::string(exp.substr(0, 64));
  const auto r = std::from_chars(size.data(), size.data() + size.size(), info.size);
  if (r.ec != std::errc() || r.ptr != size.data() + size.size() || info.size == 0)
    return Status(StatusCode::kInvalidArgument, "dmabuf descriptor: " + what + " reports size \"" +
                                                    std::string(size.substr(0, 32)) + "\"; expected a byte count > 0");
  return info;
}

StatusOr<DmabufInfo> inspect_dmabuf(int fd) {
  if (fd < 0)
    return Status(StatusCode::kInvalidArgument, "dmabuf descriptor: " + std::to_string(fd) + "; expected an open one");
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  const std::string what = "the descriptor (" + (n > 0 ? std::string(target, static_cast<size_t>(n)) : "?") + ")";
  const std::string path = "/proc/self/fdinfo/" + std::to_string(fd);
  protocol::UniqueFd info_fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!info_fd.valid())
    return Status(StatusCode::kInternal, "dmabuf descriptor: cannot open " + path + ": " + std::strerror(errno));
  // fdinfo of a dmabuf is a handful of short lines; 4 KiB holds it with room to spare.
  std::string text(4096, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(info_fd.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  return parse_dmabuf_fdinfo(text, what);
}

}  // namespace mkernel::daemon
