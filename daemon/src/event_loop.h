// event_loop.h: the client socket and the thread that serves it ("mkd-sessions"): accepts
// clients, reads one request per readable session and has it answered (requests.h), and ends
// sessions. It owns the per-session state only it touches (ClientState, client_state.h).
//
// Design notes
//  1. The socket: `<runtime_dir>/<client_socket.path>`, SOCK_SEQPACKET, mode and group from the
//     config. A socket file left by a daemon that died is removed; one a live daemon answers on
//     is not (start fails naming it).
//  2. The loop never waits on a client. It waits in poll() (at most 100 ms) on the socket, every
//     session's socket and an eventfd that proxies, connect workers and stop() write to wake it.
//     Requests are read only when poll says they are there. Replies are framed once and sent
//     without waiting; what the client's socket does not take stays in the session's outbox,
//     sent when the socket is writable again. An outbox that would hold more than
//     clients.max_queued_replies ends the session (the client stopped reading). The farewell of a
//     session that ends gets one attempt.
//  3. A session ends here, once: its client closed, said goodbye or sent something malformed;
//     its proxy ended it (a command rejected or failed); its hello did not come within
//     timeouts.handshake; its outbox overflowed; its proxy stopped checking in for longer than
//     the command timeout; or the daemon stops. The client is told why (unless it left), the
//     rings' error words are set, its connect (if any) is cancelled, its proxy lets go of it,
//     the communicator table is republished, and everything it held is given back to the
//     ledger; the last holder frees its memory, and the heap's free memory is handed back to
//     the system soon after (malloc_trim, at most once a second).
//  4. Accepting: credentials (SO_PEERCRED), the drain switch and the ledger (the process's, the
//     uid's and the node's sessions and descriptors) are checked before a session exists. A
//     connection that may not have one gets the refusal (an error reply with request id 0) and
//     is closed at once, so refused connections hold nothing. At most kAcceptBatch connections
//     are taken per turn, so a flood of connections cannot starve the sessions.
//  5. Running out of descriptors (EMFILE, ENFILE) never spins: the spare descriptor
//     (spare_fd.h) takes one waiting connection off the backlog with an answer, the event is
//     counted (refusal out_of_descriptors) and logged at most a few times a second, and the
//     listening socket rests for kAcceptPause before it is polled again. Accepting resumes by
//     itself once descriptors are free.
#pragma once

#include <atomic>
#include <chrono>
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
#include "spare_fd.h"

namespace mkernel::daemon {

class EventLoop {
 public:
  static constexpr int kAcceptBatch = 32;
  static constexpr std::chrono::milliseconds kAcceptPause{100};

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
  // Answers a connection that may not have a session and closes it (note 4).
  void refuse_connection(protocol::UniqueFd fd, const ucred& cred, Refusal reason, const Status& why);
  void handle_readable(ClientState& c);
  // Queues `reply` (with `fds`) and sends what the socket takes (note 2). False when the session
  // ended meanwhile (then `c` is gone).
  bool answer(ClientState& c, const session::v1::Reply& reply, std::vector<protocol::UniqueFd> fds = {});
  // Sends queued replies while the socket takes them. False when the session ended.
  bool flush(ClientState& c);
  // Counts a refused request of an established session (the limit noted by the handler, or
  // `otherwise`).
  void count_refusal(ClientState& c, Refusal otherwise, const Status& why);
  // Note 3: ends the session once and lets go of it (erases `c`: callers must not use it after).
  void finish_session(ClientState& c, Status why, bool client_left = false);
  void finish_connects();
  void end_sessions_of_stuck_proxies();
  void end_late_handshakes();
  void trim_heap_if_due();
  ClientState* client(uint64_t id);

  DaemonState& state_;
  ConnectJobs& connects_;
  Clients clients_;  // this thread only (after start)
  Requests requests_;
  uint64_t next_session_id_ = 1;
  protocol::UniqueFd listen_fd_;
  protocol::UniqueFd wake_fd_;
  SpareDescriptor spare_;                                  // note 5
  std::chrono::steady_clock::time_point accept_resume_{};  // note 5: not before
  std::chrono::steady_clock::time_point trim_due_{};       // note 3
  std::chrono::steady_clock::time_point last_trim_{};
  bool trim_pending_ = false;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::mutex ended_mu_;
  std::vector<uint64_t> ended_by_proxy_;  // guarded by ended_mu_
};

}  // namespace mkernel::daemon
