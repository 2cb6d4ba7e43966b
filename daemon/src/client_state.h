// client_state.h: per-session state that only the event loop touches (event_loop.h), kept apart
// from Session (session.h), whose tables other threads read. Nothing here is locked, because
// nothing here is shared: the event loop's thread is the only one that reads or writes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "mkernel/common/status.h"
#include "mkernel/protocol/shm.h"

namespace mkernel::daemon {

class Session;

struct ClientState {
  std::shared_ptr<Session> session;
  // Set at accept when the client may not have a session (credentials, drain); its hello is
  // answered with this error.
  Status refusal;
  // A client that has not said hello by then is disconnected (timeouts.handshake).
  std::chrono::steady_clock::time_point hello_deadline;
  // A connect is under way or done: regions and flags are frozen.
  bool connect_started = false;
  // GPU memory handles this session shared with its communicator (ShareHandle), by key.
  std::map<std::string, protocol::UniqueFd> shared_handles;
  // The daemon told the client why the session ended and closed its socket.
  bool farewell_sent = false;
};

// The event loop's clients, by session id.
using Clients = std::map<uint64_t, ClientState>;

}  // namespace mkernel::daemon
