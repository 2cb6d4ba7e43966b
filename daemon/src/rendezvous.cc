#include "rendezvous.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "grpc_status.h"
#include "log_text.h"

namespace mkernel::daemon {

namespace pb = mkernel::peer::v1;
using Clock = std::chrono::system_clock;

namespace {

// Constant-time comparison: how long a refusal takes says nothing about the token.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool same_entry(const pb::RankEntry& a, const pb::RankEntry& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

std::string missing_ranks(uint32_t size, const std::map<uint32_t, pb::RankEntry>& have) {
  std::string out;
  uint32_t listed = 0, missing = 0;
  for (uint32_t r = 0; r < size; ++r) {
    if (have.count(r)) continue;
    ++missing;
    if (listed < 16) {
      out += (out.empty() ? "" : ", ") + std::to_string(r);
      ++listed;
    }
  }
  if (missing > listed) out += ", ... (" + std::to_string(missing) + " in all)";
  return out;
}

}  // namespace

void RendezvousService::set_max_pending(size_t max_pending) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.max_pending = max_pending;
}

size_t RendezvousService::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return forming_.size();
}

grpc::Status RendezvousService::Join(grpc::ServerContext* context, const pb::JoinRequest* req,
                                     pb::JoinReply* reply) {
  const std::string& comm = req->communicator();
  if (comm.empty() || comm.size() > 256)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "communicator: " + std::to_string(comm.size()) + " bytes; expected 1..256"};
  if (req->size() == 0 || req->size() > options_.max_size)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "size: " + std::to_string(req->size()) + "; expected 1.." + std::to_string(options_.max_size)};
  if (req->rank() >= req->size())
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "rank: " + std::to_string(req->rank()) + "; expected 0.." + std::to_string(req->size() - 1)};
  if (req->token().empty())
    return {grpc::StatusCode::PERMISSION_DENIED, "token: empty; every communicator needs its secret token"};

  pb::RankEntry mine;
  mine.set_rank(req->rank());
  mine.set_node(req->node());
  mine.set_endpoint(req->endpoint());
  *mine.mutable_regions() = req->regions();
  mine.set_flags(req->flags());
  mine.set_instance(req->instance());

  const auto own_deadline = Clock::now() + options_.timeout;
  // Give up a little before the caller does, so the caller gets our reason (the missing ranks)
  // rather than its own transport's bare deadline error.
  const auto deadline = std::min(own_deadline, context->deadline() - std::chrono::milliseconds(50));

  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Forming> f;
  if (auto it = forming_.find(comm); it != forming_.end() && !it->second->complete) {
    f = it->second;
  } else if (it != forming_.end() && it->second->complete) {
    // A finished table still being handed out: this rank already has one, or a new job reuses
    // the id before everyone collected; either way, this join belongs to a new formation only
    // once the old one is gone.
    return {grpc::StatusCode::UNAVAILABLE,
            "communicator \"" + comm + "\" is still handing out its previous table; retry"};
  } else {
    if (forming_.size() >= options_.max_pending)
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              std::to_string(forming_.size()) + " communicators are forming; at most " +
                  std::to_string(options_.max_pending)};
    f = std::make_shared<Forming>();
    f->size = req->size();
    f->token = req->token();
    forming_.emplace(comm, f);
  }
  if (!same_secret(f->token, req->token()))
    return {grpc::StatusCode::PERMISSION_DENIED,
            "communicator \"" + comm + "\": the token does not match the communicator's"};
  if (f->size != req->size())
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "size: " + std::to_string(req->size()) + "; communicator \"" + comm + "\" has " +
                std::to_string(f->size)};
  if (auto it = f->entries.find(req->rank()); it != f->entries.end()) {
    if (!same_entry(it->second, mine))
      return {grpc::StatusCode::ALREADY_EXISTS,
              "rank " + std::to_string(req->rank()) + " of communicator \"" + comm +
                  "\" already joined with another endpoint"};
  } else {
    f->entries.emplace(req->rank(), std::move(mine));
  }
  if (f->entries.size() == f->size) {
    f->complete = true;
    cv_.notify_all();
  }
  ++f->waiting;
  // The formation is dropped when its last waiter leaves, table in hand or not.
  auto leave = [&] {
    if (--f->waiting == 0) {
      auto it = forming_.find(comm);
      if (it != forming_.end() && it->second == f) forming_.erase(it);
    }
  };
  while (!f->complete) {
    if (context->IsCancelled()) {
      leave();
      return {grpc::StatusCode::CANCELLED, "join cancelled by the caller"};
    }
    if (cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200))) ==
            std::cv_status::timeout &&
        Clock::now() >= deadline) {
      // This rank gives up; the others keep waiting until their own deadlines.
      const std::string missing = missing_ranks(f->size, f->entries);
      leave();
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - (own_deadline - options_.timeout));
      spdlog::warn("rendezvous of communicator {}: ranks {} of {} did not join within {} ms", quoted_printable(comm),
                   missing, f->size, waited.count());
      return {grpc::StatusCode::DEADLINE_EXCEEDED,
              "communicator \"" + comm + "\": ranks " + missing + " of " + std::to_string(f->size) +
                  " did not join within " + std::to_string(waited.count()) + " ms"};
    }
  }
  for (auto& [rank, entry] : f->entries) *reply->add_ranks() = entry;
  leave();
  return grpc::Status::OK;
}

StatusOr<pb::JoinReply> rendezvous_join(const std::shared_ptr<grpc::Channel>& channel,
                                        const pb::JoinRequest& request, std::chrono::milliseconds timeout) {
  auto stub = pb::Peer::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(Clock::now() + timeout);
  pb::JoinReply reply;
  const grpc::Status s = stub->Join(&ctx, request, &reply);
  if (s.ok()) {
    if (reply.ranks_size() != static_cast<int>(request.size()))
      return Status(StatusCode::kProtocolError,
                    "rendezvous table has " + std::to_string(reply.ranks_size()) + " ranks; expected " +
                        std::to_string(request.size()));
    return reply;
  }
  return from_grpc(s, "rendezvous");
}

}  // namespace mkernel::daemon
