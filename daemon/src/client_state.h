// client_state.h: per-session state that only the event loop touches (event_loop.h), kept apart
// from Session (session.h), whose tables other threads read. Nothing here is locked, because
// nothing here is shared: the event loop's thread is the only one that reads or writes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ledger.h"
#include "mkernel/common/status.h"
#include "mkernel/protocol/shm.h"

namespace mkernel::daemon {

class Session;

// A reply framed and waiting for the client to read (event_loop.h note 2). The descriptors it
// carries are the daemon's until it is sent, and are counted for the client meanwhile.
struct Outgoing {
  std::string packet;
  std::vector<protocol::UniqueFd> fds;
};

struct ClientState {
  std::shared_ptr<Session> session;
  // Who the session belongs to (its peer credentials at accept) and what the ledger counts for
  // it: the connection itself from accept on, then what its requests made. Given back, all of
  // it, when the session ends.
  Owner owner;
  Holding held;
  std::optional<uint32_t> bound_gpu;  // set at hello, counted per GPU in the ledger
  // A client that has not said hello by then is disconnected (timeouts.handshake).
  std::chrono::steady_clock::time_point hello_deadline;
  // A connect is under way or done: regions and flags are frozen.
  bool connect_started = false;
  // GPU memory handles this session shared with its communicator (ShareHandle), by key.
  std::map<std::string, protocol::UniqueFd> shared_handles;
  // Replies the client has not read yet, oldest first; at most clients.max_queued_replies.
  std::deque<Outgoing> outbox;
  // The daemon told the client why the session ended and closed its socket.
  bool farewell_sent = false;
  // Set by a request handler that refused for a limit (which one), so the event loop counts the
  // refusal under that limit rather than as an invalid request.
  std::optional<Refusal> limit_hit;
};

// The event loop's clients, by session id.
using Clients = std::map<uint64_t, ClientState>;

}  // namespace mkernel::daemon
