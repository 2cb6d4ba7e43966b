#include "grpc_status.h"

#include <string>

namespace mkernel::daemon {

StatusCode from_grpc_code(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return StatusCode::kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE: return StatusCode::kInvalidArgument;
    case grpc::StatusCode::NOT_FOUND: return StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS: return StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED: return StatusCode::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION: return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::UNIMPLEMENTED: return StatusCode::kProtocolError;  // a peer of another version
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS: return StatusCode::kInternal;
    // The call did not get an answer: cancelled by us, the server gone or restarting, aborted,
    // or an error gRPC could not classify. All may succeed when tried again.
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN:
    default: return StatusCode::kUnavailable;
  }
}

Status from_grpc(const grpc::Status& status, std::string_view what, SourceLocation where) {
  if (status.ok()) return Status::Ok();
  return Status(from_grpc_code(status.error_code()), std::string(what) + ": " + status.error_message(), where);
}

grpc::StatusCode to_grpc_code(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kPermissionDenied: return grpc::StatusCode::PERMISSION_DENIED;
    case StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kProtocolError: return grpc::StatusCode::INVALID_ARGUMENT;  // malformed input
    case StatusCode::kIoError:
    case StatusCode::kDeviceError:
    case StatusCode::kInternal: return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::UNKNOWN;
}

grpc::Status to_grpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(to_grpc_code(status.code()), status.to_string());
}

}  // namespace mkernel::daemon
