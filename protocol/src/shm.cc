#include "mkernel/protocol/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace mkernel::protocol {

size_t page_round_up(size_t bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

SharedMapping::~SharedMapping() { unmap(); }

SharedMapping::SharedMapping(SharedMapping&& o) noexcept
    : fd_(std::move(o.fd_)), addr_(o.addr_), bytes_(o.bytes_) {
  o.addr_ = nullptr;
  o.bytes_ = 0;
}

SharedMapping& SharedMapping::operator=(SharedMapping&& o) noexcept {
  if (this != &o) {
    unmap();
    fd_ = std::move(o.fd_);
    addr_ = o.addr_;
    bytes_ = o.bytes_;
    o.addr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void SharedMapping::unmap() {
  if (addr_ != nullptr) ::munmap(addr_, bytes_);
  addr_ = nullptr;
  bytes_ = 0;
}

StatusOr<SharedMapping> create_sealed_segment(const std::string& name, size_t bytes) {
  if (bytes == 0)
    return Status(StatusCode::kInvalidArgument, "segment size: 0 bytes; expected at least 1");
  const size_t size = page_round_up(bytes);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    const int e = errno;
    // Out of descriptors is a shortage, not an I/O fault: callers count it as such.
    if (e == EMFILE || e == ENFILE)
      return Status(StatusCode::kResourceExhausted, errno_status("memfd_create " + name, e).message());
    return errno_status("memfd_create " + name, e);
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return errno_status("ftruncate " + name + " to " + std::to_string(size) + " bytes", errno);
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return errno_status("sealing " + name, errno);
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return errno_status("mmap " + name, errno);
  return SharedMapping(std::move(fd), addr, size);
}

StatusOr<SharedMapping> map_segment(UniqueFd fd, size_t expected_bytes, bool require_seals) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return errno_status("fstat of received segment", errno);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return Status(StatusCode::kProtocolError, "received segment: 0 bytes; expected a sized memfd");
  if (expected_bytes != 0 && size != expected_bytes)
    return Status(StatusCode::kProtocolError,
                  "received segment: " + std::to_string(size) + " bytes; expected " +
                      std::to_string(expected_bytes));
  if (require_seals) {
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
      return Status(StatusCode::kProtocolError, "received segment is not sealed against shrinking");
  }
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return errno_status("mmap of received segment", errno);
  return SharedMapping(std::move(fd), addr, size);
}

}  // namespace mkernel::protocol
