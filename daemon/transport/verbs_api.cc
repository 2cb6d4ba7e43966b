// verbs_api.cc: the VerbsApi that calls libibverbs, and the naming of work completion statuses.
#include "verbs_api.h"

#include "verbs_transport.h"

namespace mkernel::daemon::net {
namespace {

// ---- the real libibverbs ------------------------------------------------------------------

class RealVerbsApi final : public VerbsApi {
 public:
  ibv_device** get_device_list(int* n) override { return ::ibv_get_device_list(n); }
  void free_device_list(ibv_device** list) override { ::ibv_free_device_list(list); }
  const char* get_device_name(ibv_device* d) override { return ::ibv_get_device_name(d); }
  ibv_context* open_device(ibv_device* d) override { return ::ibv_open_device(d); }
  int close_device(ibv_context* c) override { return ::ibv_close_device(c); }
  int query_device(ibv_context* c, ibv_device_attr* a) override {
    return ::ibv_query_device(c, a);
  }
  int query_port(ibv_context* c, uint8_t port, ibv_port_attr* a) override {
    return ibv_query_port(c, port, a);  // a macro in verbs.h
  }
  int query_gid(ibv_context* c, uint8_t port, int index, ibv_gid* gid) override {
    return ::ibv_query_gid(c, port, index, gid);
  }
  ibv_pd* alloc_pd(ibv_context* c) override { return ::ibv_alloc_pd(c); }
  int dealloc_pd(ibv_pd* pd) override { return ::ibv_dealloc_pd(pd); }
  ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) override {
    return ibv_reg_mr(pd, addr, length, access);  // a macro in verbs.h
  }
  ibv_mr* reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                        int access) override {
    return ::ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
  }
  int dereg_mr(ibv_mr* mr) override { return ::ibv_dereg_mr(mr); }
  ibv_cq* create_cq(ibv_context* c, int cqe) override {
    return ::ibv_create_cq(c, cqe, nullptr, nullptr, 0);
  }
  int destroy_cq(ibv_cq* cq) override { return ::ibv_destroy_cq(cq); }
  ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) override {
    return ::ibv_create_qp(pd, attr);
  }
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) override {
    return ::ibv_modify_qp(qp, attr, mask);
  }
  int destroy_qp(ibv_qp* qp) override { return ::ibv_destroy_qp(qp); }
  int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) override {
    return ::ibv_post_send(qp, wr, bad);
  }
  int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) override { return ::ibv_poll_cq(cq, n, wc); }
  const char* wc_status_str(ibv_wc_status s) override { return ::ibv_wc_status_str(s); }
};

}  // namespace

std::shared_ptr<VerbsApi> real_verbs_api() { return std::make_shared<RealVerbsApi>(); }

const char* wc_status_name(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "IBV_WC_SUCCESS";
    case IBV_WC_LOC_LEN_ERR: return "IBV_WC_LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR: return "IBV_WC_LOC_QP_OP_ERR";
    case IBV_WC_LOC_EEC_OP_ERR: return "IBV_WC_LOC_EEC_OP_ERR";
    case IBV_WC_LOC_PROT_ERR: return "IBV_WC_LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR: return "IBV_WC_WR_FLUSH_ERR";
    case IBV_WC_MW_BIND_ERR: return "IBV_WC_MW_BIND_ERR";
    case IBV_WC_BAD_RESP_ERR: return "IBV_WC_BAD_RESP_ERR";
    case IBV_WC_LOC_ACCESS_ERR: return "IBV_WC_LOC_ACCESS_ERR";
    case IBV_WC_REM_INV_REQ_ERR: return "IBV_WC_REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR: return "IBV_WC_REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR: return "IBV_WC_REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR: return "IBV_WC_RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "IBV_WC_RNR_RETRY_EXC_ERR";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "IBV_WC_LOC_RDD_VIOL_ERR";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "IBV_WC_REM_INV_RD_REQ_ERR";
    case IBV_WC_REM_ABORT_ERR: return "IBV_WC_REM_ABORT_ERR";
    case IBV_WC_INV_EECN_ERR: return "IBV_WC_INV_EECN_ERR";
    case IBV_WC_INV_EEC_STATE_ERR: return "IBV_WC_INV_EEC_STATE_ERR";
    case IBV_WC_FATAL_ERR: return "IBV_WC_FATAL_ERR";
    case IBV_WC_RESP_TIMEOUT_ERR: return "IBV_WC_RESP_TIMEOUT_ERR";
    case IBV_WC_GENERAL_ERR: return "IBV_WC_GENERAL_ERR";
    case IBV_WC_TM_ERR: return "IBV_WC_TM_ERR";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "IBV_WC_TM_RNDV_INCOMPLETE";
  }
  return "IBV_WC_(unknown)";
}

StatusCode wc_status_code(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return StatusCode::kOk;
    // The peer did not answer in time: it may be gone or the path down.
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_REM_ABORT_ERR: return StatusCode::kUnavailable;
    // A key, a bound or an access right did not allow the write.
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_MW_BIND_ERR: return StatusCode::kPermissionDenied;
    // Not executed because the queue pair already failed.
    case IBV_WC_WR_FLUSH_ERR: return StatusCode::kFailedPrecondition;
    default: return StatusCode::kDeviceError;
  }
}

}  // namespace mkernel::daemon::net
