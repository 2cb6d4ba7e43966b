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

  const auto refused = [&] {  // called with mu_ held
    // Logged at most kRefusalLinesPerSecond a second: a stranger retrying cannot flood the log.
    const auto now = std::chrono::steady_clock::now();
    if (now - refusal_window_ >= std::chrono::seconds(1)) {
      refusal_window_ = now;
      refusal_lines_ = 0;
    }
    if (refusal_lines_ < kRefusalLinesPerSecond) {
      ++refusal_lines_;
      spdlog::warn("rendezvous of communicator {}: a join as rank {} from {} refused: wrong token{}",
                   quoted_printable(comm), req->rank(), quoted_printable(context->peer()),
                   refusals_unlogged_ == 0 ? std::string()
                                           : " (and " + std::to_string(refusals_unlogged_) + " more refusals not logged)");
      refusals_unlogged_ = 0;
    } else {
      ++refusals_unlogged_;
    }
    return grpc::Status{grpc::StatusCode::PERMISSION_DENIED,
                        "communicator \"" + comm + "\": the token does not match the communicator's"};
  };
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Forming> f;
  if (auto it = forming_.find(comm); it != forming_.end()) {
    f = it->second;
  } else {
    if (forming_.size() >= options_.max_pending)
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              std::to_string(forming_.size()) + " communicators are forming; at most " +
                  std::to_string(options_.max_pending)};
    f = std::make_shared<Forming>();
    forming_.emplace(comm, f);
  }
  // The group of this join's token (compared in constant time, never looked up by it).
  std::shared_ptr<Group> g;
  for (const auto& candidate : f->groups)
    if (same_secret(candidate->token, req->token())) g = candidate;
  const auto drop_if_empty = [&] {
    if (!f->groups.empty()) return;
    auto it = forming_.find(comm);
    if (it != forming_.end() && it->second == f) forming_.erase(it);
  };
  const auto foreign = [&] { return f->owned && !same_secret(f->owner_token, req->token()); };
  if (foreign()) return refused();
  if (g && g->complete) {
    // A finished table still being handed out: this rank already has one, or a new job reuses
    // the id before everyone collected; either way, this join belongs to a new formation only
    // once the old one is gone.
    return {grpc::StatusCode::UNAVAILABLE,
            "communicator \"" + comm + "\" is still handing out its previous table; retry"};
  }
  if (!g) {
    if (f->groups.size() >= kMaxTokenGroups)
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              "communicator \"" + comm + "\": " + std::to_string(f->groups.size()) +
                  " different tokens are already waiting for rank 0; at most " + std::to_string(kMaxTokenGroups)};
    g = std::make_shared<Group>();
    g->size = req->size();
    g->token = req->token();
    f->groups.push_back(g);
  }
  if (g->size != req->size())  // an existing group: a new one takes this join's size
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "size: " + std::to_string(req->size()) + "; communicator \"" + comm + "\" has " + std::to_string(g->size)};
  if (auto it = g->entries.find(req->rank()); it != g->entries.end()) {
    if (!same_entry(it->second, mine))
      return {grpc::StatusCode::ALREADY_EXISTS,
              "rank " + std::to_string(req->rank()) + " of communicator \"" + comm +
                  "\" already joined with another endpoint"};
  } else {
    g->entries.emplace(req->rank(), std::move(mine));
  }
  if (req->rank() == 0 && !f->owned) {
    // Rank 0 names the communicator's token: the waiters of every other token are refused.
    f->owned = true;
    f->owner_token = g->token;
    cv_.notify_all();
  }
  if (g->entries.size() == g->size) {
    g->complete = true;
    cv_.notify_all();
  }
  ++g->waiting;
  // A group is dropped when its last waiter leaves, table in hand or not; the formation when its
  // last group is.
  auto leave = [&] {
    if (--g->waiting != 0) return;
    f->groups.erase(std::find(f->groups.begin(), f->groups.end(), g));
    drop_if_empty();
  };
  while (!g->complete) {
    if (foreign()) {
      leave();
      return refused();
    }
    if (context->IsCancelled()) {
      leave();
      return {grpc::StatusCode::CANCELLED, "join cancelled by the caller"};
    }
    if (cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200))) ==
            std::cv_status::timeout &&
        Clock::now() >= deadline) {
      // This rank gives up; the others keep waiting until their own deadlines.
      const std::string missing = missing_ranks(g->size, g->entries);
      const uint32_t size = g->size;
      leave();
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - (own_deadline - options_.timeout));
      spdlog::warn("rendezvous of communicator {}: ranks {} of {} did not join within {} ms", quoted_printable(comm),
                   missing, size, waited.count());
      return {grpc::StatusCode::DEADLINE_EXCEEDED,
              "communicator \"" + comm + "\": ranks " + missing + " of " + std::to_string(size) +
                  " did not join within " + std::to_string(waited.count()) + " ms"};
    }
  }
  for (auto& [rank, entry] : g->entries) *reply->add_ranks() = entry;
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
