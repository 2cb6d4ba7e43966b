// event_loop.h: the client socket and the thread that serves it ("mkd-sessions"): accepts
// clients, reads one request per readable session and has it answered (requests.h), and ends
// sessions. It owns the per-session state only it touches (ClientState, client_state.h).
//
// Design notes
//  1. The socket: `<runtime_dir>/<client_socket.path>`, SOCK_SEQPACKET, mode and group from the
//     config. A socket file left by a daemon that died is removed; one a live daemon answers on
//     is not (start fails naming it).
//  2. The loop waits in poll() (at most 100 ms) on the socket, every session's socket and an
//     eventfd that proxies, connect workers and stop() write to wake it. It never waits on one
//     client for longer than a send bound (1 s for a reply, 100 ms for a farewell).
//  3. A session ends here, once: its client closed, said goodbye or sent something malformed;
//     its proxy ended it (a command rejected or failed); its hello did not come within
//     timeouts.handshake; its proxy stopped checking in for longer than the command timeout; or
//     the daemon stops. The client is told why (unless it left), the rings' error words are
//     set, its connect (if any) is cancelled, its proxy lets go of it and the communicator
//     table is republished; the last holder frees its memory.
//  4. Credentials (SO_PEERCRED) are checked at accept; a client that may not have a session
//     (uid/gid lists, drain) is told so in the answer to its hello, not before (an answer sent
//     before the hello was read could be lost when the socket closes with the hello unread).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "client_state.h"
#include "daemon_state.h"
#include "mkernel/common/status.h"
#include "mkernel/protocol/shm.h"
#include "peering.h"
#include "requests.h"

namespace mkernel::daemon {

class EventLoop {
 public:
  EventLoop(DaemonState& state, ConnectJobs& connects);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Creates the client socket (note 1) and the wake eventfd; sets state.socket_path.
  Status open();
  // Starts the thread.
  void start();
  // Ends every session (clients are told the daemon is stopping) and joins the thread; then
  // closes the socket and removes its file. Idempotent.
  void stop();
  // Any thread: makes the loop look at its work now.
  void wake();
  // Any thread (a proxy): the proxy ended session `id`; the loop tells the client and lets go.
  void session_ended_by_proxy(uint64_t id);

 private:
  void run();
  void accept_clients();
  void handle_readable(ClientState& c);
  // Sends `reply` (and `fds`); a failed send ends the session.
  void answer(ClientState& c, const session::v1::Reply& reply, const std::vector<int>& fds = {});
  // Note 3: ends the session once and lets go of it (erases `c`: callers must not use it after).
  void finish_session(ClientState& c, Status why, bool client_left = false);
  void finish_connects();
  void end_sessions_of_stuck_proxies();
  ClientState* client(uint64_t id);

  DaemonState& state_;
  ConnectJobs& connects_;
  Clients clients_;  // this thread only (after start)
  Requests requests_;
  uint64_t next_session_id_ = 1;
  protocol::UniqueFd listen_fd_;
  protocol::UniqueFd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::mutex ended_mu_;
  std::vector<uint64_t> ended_by_proxy_;  // guarded by ended_mu_
};

}  // namespace mkernel::daemon
