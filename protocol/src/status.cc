#include "mkernel/common/status.h"

#include <cstring>

namespace mkernel {

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

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status errno_status(std::string_view what, int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(StatusCode::kIoError, std::string(what) + ": " + text);
}

}  // namespace mkernel
