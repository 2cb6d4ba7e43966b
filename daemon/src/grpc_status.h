// grpc_status.h: the one mapping between mkernel::Status and grpc::Status, both ways. The peer
// service's callers (rendezvous joins) read gRPC results with from_grpc; the admin service
// answers with to_grpc. Codes that have no counterpart fold as the tables in grpc_status.cc say.
#pragma once

#include <grpcpp/support/status.h>

#include <string_view>

#include "mkernel/common/status.h"

namespace mkernel::daemon {

// The StatusCode a gRPC result stands for. CANCELLED (the call was abandoned: a stop, a
// session that went away) and UNAVAILABLE are kUnavailable, so the caller may try again.
StatusCode from_grpc_code(grpc::StatusCode code);
// `what`: the gRPC error message, the Status made at the caller's line. Ok stays ok.
Status from_grpc(const grpc::Status& status, std::string_view what,
                 SourceLocation where = SourceLocation::current());

// The gRPC code a Status is answered with, and the answer: the code and to_string() (code name,
// message and where it was made), so an operator's tool shows all of it.
grpc::StatusCode to_grpc_code(StatusCode code);
grpc::Status to_grpc(const Status& status);

}  // namespace mkernel::daemon
