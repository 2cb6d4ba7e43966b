// verbs_api.h: the libibverbs calls the verbs transport makes, behind one interface.
//
// Design notes
//  1. Why an interface: no machine we build on has an RDMA NIC, so the transport's logic (queue
//     pair state transitions, work request construction, selective signalling, completion
//     mapping, teardown order) is tested against a recording fake. The real implementation is a
//     one-line forward per method to libibverbs.
//  2. Conventions follow libibverbs exactly, so the fake has to model them too: calls returning
//     a pointer return nullptr and set errno on failure; calls returning int return 0 on success
//     and an errno value on failure (ibv_modify_qp, ibv_post_send, ibv_query_port, the destroy
//     calls); poll_cq returns the number of completions or a negative value.
//  3. Ownership: the interface creates nothing by itself; the caller destroys every object it
//     gets back through the matching destroy/close call, in reverse creation order.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

namespace mkernel::daemon::net {

class VerbsApi {
 public:
  virtual ~VerbsApi() = default;

  virtual ibv_device** get_device_list(int* num_devices) = 0;
  virtual void free_device_list(ibv_device** list) = 0;
  virtual const char* get_device_name(ibv_device* device) = 0;
  virtual ibv_context* open_device(ibv_device* device) = 0;
  virtual int close_device(ibv_context* context) = 0;

  virtual int query_device(ibv_context* context, ibv_device_attr* attr) = 0;
  virtual int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) = 0;
  virtual int query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) = 0;

  virtual ibv_pd* alloc_pd(ibv_context* context) = 0;
  virtual int dealloc_pd(ibv_pd* pd) = 0;

  virtual ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) = 0;
  virtual ibv_mr* reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                                int fd, int access) = 0;
  virtual int dereg_mr(ibv_mr* mr) = 0;

  virtual ibv_cq* create_cq(ibv_context* context, int cqe) = 0;
  virtual int destroy_cq(ibv_cq* cq) = 0;

  // `init_attr->cap` is updated with what the provider granted (max_inline_data in particular).
  virtual ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* init_attr) = 0;
  virtual int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = 0;
  virtual int destroy_qp(ibv_qp* qp) = 0;

  // On failure `*bad_wr` is the first work request that was not posted.
  virtual int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = 0;
  virtual int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) = 0;

  virtual const char* wc_status_str(ibv_wc_status status) = 0;
};

// The implementation that calls libibverbs.
std::shared_ptr<VerbsApi> real_verbs_api();

}  // namespace mkernel::daemon::net
