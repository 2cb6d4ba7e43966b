// transport.h: how a proxy carries out a validated command.
//
// Contract (the transports issue widens it to asynchronous network transports):
//  - execute() is called only by the owning proxy's thread, with a command that decode() and
//    the proxy's own checks accepted: source region owned by `src` and in bounds.
//  - It returns Ok when the data (and the flag, for signalling ops) are in place at the
//    destination, or the error the source session gets. It may not block longer than the
//    configured command timeout.
//  - Destination checks (region exists, is remotely writable, range in bounds, flag index in
//    range) are the transport's, since only it knows the destination; a failure there is a
//    rejection (the command was invalid), reported through `reject`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/protocol/command.h"

namespace mkernel::daemon {

class Session;

// Ranks of one communicator on this node, indexed by rank; null where none is connected.
using PeerList = std::vector<std::shared_ptr<Session>>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual std::string nic() const = 0;  // "" when none
  // On rejection, sets *reject and returns Ok; on a transport failure returns the error.
  virtual Status execute(Session& src, const PeerList& peers, const protocol::Command& cmd,
                         protocol::RejectReason* reject) = 0;
};

// Carries commands between sessions of this daemon with memcpy and release stores of flags:
// the data path end to end without a network. Ranks of a communicator must all be connected
// to this daemon.
class LoopbackTransport final : public Transport {
 public:
  std::string name() const override { return "loopback"; }
  std::string nic() const override { return "loopback"; }
  Status execute(Session& src, const PeerList& peers, const protocol::Command& cmd,
                 protocol::RejectReason* reject) override;
};

}  // namespace mkernel::daemon
