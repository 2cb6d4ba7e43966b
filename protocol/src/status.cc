#include "mkernel/common/status.h"

#include <cstring>

namespace mkernel {

namespace {
std::string_view base_name(const char* path) {
  if (path == nullptr) return {};
  const std::string_view p(path);
  const size_t slash = p.find_last_of('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}
}  // namespace

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kAlreadyExists: return "already exists";
    case StatusCode::kPermissionDenied: return "permission denied";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kFailedPrecondition: return "failed precondition";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kDeadlineExceeded: return "deadline exceeded";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kProtocolError: return "protocol error";
    case StatusCode::kDeviceError: return "device error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown status";
}

std::string_view Status::file() const { return base_name(file_); }

std::string Status::where() const {
  if (ok() || file_ == nullptr) return {};
  return std::string(file()) + ":" + std::to_string(line_) + trail_;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out = std::string(status_code_name(code_)) + ": " + message_;
  if (file_ != nullptr) out += " (at " + where() + ")";
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  Status out = *this;
  out.message_ = std::string(context) + ": " + message_;
  return out;
}

Status Status::passed_through(SourceLocation site) const {
  if (ok()) return *this;
  Status out = *this;
  out.trail_ += " via " + std::string(base_name(site.file_name())) + ":" + std::to_string(site.line());
  return out;
}

Status errno_status(std::string_view what, int err, SourceLocation where) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(StatusCode::kIoError, std::string(what) + ": " + text, where);
}

}  // namespace mkernel
