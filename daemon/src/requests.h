// requests.h: the answers to clients' setup requests (protocol/proto/session.proto), on the
// event loop's thread: hello, rings, regions (host memory the daemon makes, GPU memory the
// client hands over), flags, shared handles, ping, and connecting a communicator that spans
// daemons (started here, run by ConnectJobs, answered by connected()).
//
// Design notes
//  1. Every handler checks the request whole before it changes anything; a refusal is the
//     Status the client is answered with, naming the field, the value and what was expected.
//     The event loop sends the reply and decides whether the session goes on (event_loop.h).
//  2. Handlers read and write the client's ClientState (event loop only) and the Session's
//     tables (published to the proxy as they grow); they never block on a proxy or a peer.
//  3. Limits: a handler checks the session's quota, then takes what the request makes from the
//     ledger (the process's, the uid's and the node's limits, ledger.h) before it makes
//     anything, and gives it back if making it fails. A refusal for a limit is noted in
//     ClientState::limit_hit so the event loop counts it under that limit.
//  4. Replies that hand over a descriptor carry it as an owned UniqueFd: for host memory the
//     daemon's only descriptor, which closes once the reply is sent (the mapping stays); for a
//     fetched handle a duplicate. Either is counted for the client until then.
#pragma once

#include <cstdint>
#include <vector>

#include "client_state.h"
#include "daemon_state.h"
#include "mkernel/common/status.h"
#include "mkernel/protocol/shm.h"
#include "peering.h"

namespace mkernel::session::v1 {
class Request;
class Reply;
class Hello;
class ImportRegion;
class ShareHandle;
}  // namespace mkernel::session::v1

namespace mkernel::daemon {

class Requests {
 public:
  // `clients`: the event loop's table, read to find another rank's shared handles.
  Requests(DaemonState& state, ConnectJobs& connects, const Clients& clients);

  // The first request of every session: who the client is and which GPU it uses. On success the
  // session is live: its proxy has it and the communicator table is republished.
  Status hello(ClientState& c, const session::v1::Request& req, session::v1::Reply* reply);
  // CreateRing, CreateRegion, CreateFlags, FetchHandle, Ping. `fds`: descriptors to pass with
  // the reply (note 4), each already counted in c.held.descriptors.
  Status setup(ClientState& c, const session::v1::Request& req, session::v1::Reply* reply,
               std::vector<protocol::UniqueFd>* fds);
  // ImportRegion: a GPU-memory region handed over as a dmabuf descriptor.
  Status import_region(ClientState& c, const session::v1::ImportRegion& r, protocol::UniqueFd dmabuf,
                       session::v1::Reply* reply);
  // ShareHandle: keeps `fd` under `key` for the communicator's other ranks (FetchHandle).
  Status share_handle(ClientState& c, const session::v1::ShareHandle& h, protocol::UniqueFd fd,
                      session::v1::Reply* reply);
  // Connect: checks the request and starts a connect job; the answer comes from connected().
  Status connect(ClientState& c, const session::v1::Request& req);
  // The answer to a finished connect job (a Connected with every rank's route, or the error);
  // on success the session gets its network.
  void connected(ClientState& c, ConnectJob& job, session::v1::Reply* reply);

  // Note 3: takes `ask` for the client, or answers why not (and notes the limit).
  Status take(ClientState& c, const Holding& ask);
  // Gives part of what the client holds back (a reply's descriptors once sent, ...).
  void give_back(ClientState& c, const Holding& what);

 private:
  Status create_ring(ClientState& c, uint32_t capacity_log2, session::v1::Reply* reply,
                     std::vector<protocol::UniqueFd>* fds);
  Status create_region(ClientState& c, uint64_t bytes, bool remote_writable, session::v1::Reply* reply,
                       std::vector<protocol::UniqueFd>* fds);
  Status create_flags(ClientState& c, uint32_t count, session::v1::Reply* reply,
                      std::vector<protocol::UniqueFd>* fds);
  Status fetch_handle(ClientState& c, const session::v1::Request& req, session::v1::Reply* reply,
                      std::vector<protocol::UniqueFd>* fds);
  // A limit of the session itself (clients.quota): noted like a ledger refusal.
  Status over_quota(ClientState& c, Refusal which, std::string text);
  // Making shared memory failed after the ledger took it (given back by the caller): a
  // shortage of descriptors is noted as such.
  Status made_nothing(ClientState& c, Status why);

  DaemonState& state_;
  ConnectJobs& connects_;
  const Clients& clients_;
};

// Puts `s` into `reply`'s error field (code and message).
void fill_error(session::v1::Reply* reply, const Status& s);

}  // namespace mkernel::daemon
