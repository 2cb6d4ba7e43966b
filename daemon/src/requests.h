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
  // the reply (they stay owned by the session).
  Status setup(ClientState& c, const session::v1::Request& req, session::v1::Reply* reply,
               std::vector<int>* fds);
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

 private:
  DaemonState& state_;
  ConnectJobs& connects_;
  const Clients& clients_;
};

// Puts `s` into `reply`'s error field (code and message).
void fill_error(session::v1::Reply* reply, const Status& s);

}  // namespace mkernel::daemon
