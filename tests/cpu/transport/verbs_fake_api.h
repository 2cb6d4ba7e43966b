// verbs_fake_api.h: a recording VerbsApi for the verbs transport's tests.
//
// It hands out real libibverbs structs (zero-filled, with the fields the transport reads set:
// qp_num, lkey, rkey), records every call in order with the object it touched, keeps copies of
// modify_qp attributes and of every posted work request, and returns the work completions a
// test queues. Knobs make individual calls fail the way libibverbs does (nullptr + errno, or an
// errno return).
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "verbs_api.h"

namespace mkernel::daemon::net::testing {

class FakeVerbsApi final : public VerbsApi {
 public:
  struct ModifyCall {
    uint32_t qp_num = 0;
    ibv_qp_attr attr{};
    int mask = 0;
  };
  struct PostedWr {
    uint32_t qp_num = 0;
    uint64_t wr_id = 0;
    ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
    unsigned send_flags = 0;
    std::vector<ibv_sge> sges;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint64_t payload = 0;  // the 8 bytes at the first sge, read at post time
  };
  struct RegCall {
    bool dmabuf = false;
    void* addr = nullptr;
    uint64_t offset = 0;
    size_t length = 0;
    uint64_t iova = 0;
    int fd = -1;
    int access = 0;
    uint32_t lkey = 0;
    uint32_t rkey = 0;
  };

  // ---- knobs
  std::vector<std::string> device_names{"mlx5_0"};
  std::vector<ibv_port_state> port_states{IBV_PORT_ACTIVE};
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  uint16_t lid = 0x11;
  ibv_mtu active_mtu = IBV_MTU_4096;
  uint32_t granted_inline = 64;
  uint8_t gid_prefix_byte = 0xfe;  // gid[0]; the subnet prefix is gid[0..8)
  int fail_reg_errno = 0;
  int max_qp_rd_atom = 0;       // device limits on RDMA reads per queue pair (0: unreported)
  int max_qp_init_rd_atom = 0;
  int fail_modify_errno = 0;        // for the modify_qp call number fail_modify_at (0-based)
  int fail_modify_at = -1;
  int fail_post_errno = 0;          // next post_send fails with this errno...
  int fail_post_index = 0;          // ...at this work request of the chain (0: none posted)
  int poll_error = 0;               // poll_cq returns this when negative
  std::deque<ibv_wc> completions;   // what poll_cq returns, in order

  // ---- records
  std::vector<std::string> calls;   // "create_qp#256", "dereg_mr#4097", ...
  std::vector<ModifyCall> modifies;
  std::vector<std::vector<PostedWr>> posts;  // one entry per successful post_send call
  std::vector<RegCall> regs;

  ibv_device** get_device_list(int* n) override {
    calls.push_back("get_device_list");
    if (device_names.empty()) {
      *n = 0;
      errno = ENOSYS;
      return nullptr;
    }
    devices_.clear();
    list_.clear();
    for (size_t i = 0; i < device_names.size(); ++i) {
      devices_.push_back(std::make_unique<ibv_device>());
      std::strncpy(devices_.back()->name, device_names[i].c_str(), IBV_SYSFS_NAME_MAX - 1);
      list_.push_back(devices_.back().get());
    }
    list_.push_back(nullptr);
    *n = static_cast<int>(device_names.size());
    return list_.data();
  }
  void free_device_list(ibv_device**) override { calls.push_back("free_device_list"); }
  const char* get_device_name(ibv_device* d) override {
    calls.push_back(std::string("get_device_name#") + d->name);
    return d->name;
  }
  ibv_context* open_device(ibv_device* d) override {
    contexts_.push_back(std::make_unique<ibv_context>());
    contexts_.back()->device = d;
    calls.push_back(std::string("open_device#") + d->name);
    return contexts_.back().get();
  }
  int close_device(ibv_context* c) override {
    calls.push_back(std::string("close_device#") + c->device->name);
    return 0;
  }
  int query_device(ibv_context*, ibv_device_attr* a) override {
    calls.push_back("query_device");
    *a = ibv_device_attr{};
    std::strcpy(a->fw_ver, "16.35.1012");
    a->max_qp_wr = 32768;
    a->max_cqe = 4194303;
    a->max_qp_rd_atom = max_qp_rd_atom;
    a->max_qp_init_rd_atom = max_qp_init_rd_atom;
    return 0;
  }
  int query_port(ibv_context* c, uint8_t port, ibv_port_attr* a) override {
    calls.push_back("query_port#" + std::to_string(port));
    *a = ibv_port_attr{};
    size_t idx = 0;
    for (size_t i = 0; i < device_names.size(); ++i)
      if (device_names[i] == c->device->name) idx = i;
    a->state = idx < port_states.size() ? port_states[idx] : IBV_PORT_DOWN;
    a->link_layer = link_layer;
    a->lid = lid;
    a->active_mtu = active_mtu;
    a->max_msg_sz = 1u << 30;
    return 0;
  }
  int query_gid(ibv_context*, uint8_t, int index, ibv_gid* gid) override {
    calls.push_back("query_gid#" + std::to_string(index));
    for (int i = 0; i < 16; ++i) gid->raw[i] = static_cast<uint8_t>(0xa0 + i);
    gid->raw[0] = gid_prefix_byte;
    return 0;
  }
  ibv_pd* alloc_pd(ibv_context*) override {
    pds_.push_back(std::make_unique<ibv_pd>());
    calls.push_back("alloc_pd");
    return pds_.back().get();
  }
  int dealloc_pd(ibv_pd*) override {
    calls.push_back("dealloc_pd");
    return 0;
  }
  ibv_mr* reg_mr(ibv_pd*, void* addr, size_t length, int access) override {
    return make_mr(RegCall{false, addr, 0, length, 0, -1, access, 0, 0});
  }
  ibv_mr* reg_dmabuf_mr(ibv_pd*, uint64_t offset, size_t length, uint64_t iova, int fd,
                        int access) override {
    return make_mr(RegCall{true, nullptr, offset, length, iova, fd, access, 0, 0});
  }
  int dereg_mr(ibv_mr* mr) override {
    calls.push_back("dereg_mr#" + std::to_string(mr->lkey));
    return 0;
  }
  ibv_cq* create_cq(ibv_context*, int cqe) override {
    cqs_.push_back(std::make_unique<ibv_cq>());
    cqs_.back()->cqe = cqe;
    calls.push_back("create_cq#" + std::to_string(cqe));
    return cqs_.back().get();
  }
  int destroy_cq(ibv_cq*) override {
    calls.push_back("destroy_cq");
    return 0;
  }
  ibv_qp* create_qp(ibv_pd*, ibv_qp_init_attr* init) override {
    last_qp_init = *init;
    init->cap.max_inline_data = granted_inline;
    qps_.push_back(std::make_unique<ibv_qp>());
    qps_.back()->qp_num = next_qpn_++;
    qps_.back()->qp_type = init->qp_type;
    calls.push_back("create_qp#" + std::to_string(qps_.back()->qp_num));
    return qps_.back().get();
  }
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) override {
    calls.push_back("modify_qp#" + std::to_string(qp->qp_num));
    const int at = static_cast<int>(modifies.size());
    modifies.push_back({qp->qp_num, *attr, mask});
    if (at == fail_modify_at) return fail_modify_errno;
    return 0;
  }
  int destroy_qp(ibv_qp* qp) override {
    calls.push_back("destroy_qp#" + std::to_string(qp->qp_num));
    return 0;
  }
  int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) override {
    calls.push_back("post_send#" + std::to_string(qp->qp_num));
    std::vector<PostedWr> chain;
    int index = 0;
    for (ibv_send_wr* w = wr; w != nullptr; w = w->next, ++index) {
      if (fail_post_errno != 0 && index == fail_post_index) {
        *bad = w;
        const int err = fail_post_errno;
        fail_post_errno = 0;
        if (!chain.empty()) posts.push_back(chain);
        return err;
      }
      PostedWr p;
      p.qp_num = qp->qp_num;
      p.wr_id = w->wr_id;
      p.opcode = w->opcode;
      p.send_flags = w->send_flags;
      for (int i = 0; i < w->num_sge; ++i) p.sges.push_back(w->sg_list[i]);
      p.remote_addr = w->wr.rdma.remote_addr;
      p.rkey = w->wr.rdma.rkey;
      if (!p.sges.empty() && p.sges[0].length == sizeof(uint64_t))
        std::memcpy(&p.payload, reinterpret_cast<const void*>(p.sges[0].addr), sizeof(uint64_t));
      chain.push_back(p);
    }
    posts.push_back(chain);
    return 0;
  }
  int poll_cq(ibv_cq*, int n, ibv_wc* wc) override {
    if (poll_error < 0) return poll_error;
    int got = 0;
    while (got < n && !completions.empty()) {
      wc[got++] = completions.front();
      completions.pop_front();
    }
    return got;
  }
  const char* wc_status_str(ibv_wc_status s) override { return ::ibv_wc_status_str(s); }

  // ---- helpers for tests
  void complete(uint32_t qp_num, uint64_t wr_id, ibv_wc_status status = IBV_WC_SUCCESS,
                uint32_t vendor_err = 0) {
    ibv_wc wc{};
    wc.qp_num = qp_num;
    wc.wr_id = wr_id;
    wc.status = status;
    wc.vendor_err = vendor_err;
    wc.opcode = IBV_WC_RDMA_WRITE;
    completions.push_back(wc);
  }
  // Every posted work request, flattened in post order.
  std::vector<PostedWr> all_wrs() const {
    std::vector<PostedWr> out;
    for (const auto& chain : posts) out.insert(out.end(), chain.begin(), chain.end());
    return out;
  }

  ibv_qp_init_attr last_qp_init{};

 private:
  ibv_mr* make_mr(RegCall r) {
    if (fail_reg_errno != 0) {
      errno = fail_reg_errno;
      return nullptr;
    }
    mrs_.push_back(std::make_unique<ibv_mr>());
    ibv_mr* mr = mrs_.back().get();
    mr->lkey = next_lkey_++;
    mr->rkey = next_rkey_++;
    mr->addr = r.dmabuf ? reinterpret_cast<void*>(r.iova) : r.addr;
    mr->length = r.length;
    r.lkey = mr->lkey;
    r.rkey = mr->rkey;
    regs.push_back(r);
    calls.push_back(std::string(r.dmabuf ? "reg_dmabuf_mr#" : "reg_mr#") +
                    std::to_string(mr->lkey));
    return mr;
  }

  std::vector<std::unique_ptr<ibv_device>> devices_;
  std::vector<ibv_device*> list_;
  std::vector<std::unique_ptr<ibv_context>> contexts_;
  std::vector<std::unique_ptr<ibv_pd>> pds_;
  std::vector<std::unique_ptr<ibv_mr>> mrs_;
  std::vector<std::unique_ptr<ibv_cq>> cqs_;
  std::vector<std::unique_ptr<ibv_qp>> qps_;
  uint32_t next_qpn_ = 0x100;
  uint32_t next_lkey_ = 0x1000;
  uint32_t next_rkey_ = 0x5ec0de00;
};

}  // namespace mkernel::daemon::net::testing
