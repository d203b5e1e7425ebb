// The op library's side of the core's C door (door.h), and appliance_tf_set_core_api, the one
// symbol Python calls through ctypes.
#include "door.h"

#include <atomic>
#include <cstring>

namespace appliance_tf {
namespace {
std::atomic<const appliance_core_api*> g_api{nullptr};

constexpr const char* kNotInitialized = "the collective runtime has not been initialized; call hvd.init() first";

thread_local bool t_inline = false;  // this thread is inside CollectiveKernel::Compute
}  // namespace

const appliance_core_api* api() { return g_api.load(std::memory_order_acquire); }

int core_dtype(tensorflow::DataType t) {
  using namespace tensorflow;
  switch (t) {
    case DT_UINT8: return APPLIANCE_UINT8;
    case DT_INT8: return APPLIANCE_INT8;
    case DT_INT16: return APPLIANCE_INT16;
    case DT_UINT16: return APPLIANCE_INT16;  // only the byte-moving ops take it (their type lists)
    case DT_INT32: return APPLIANCE_INT32;
    case DT_INT64: return APPLIANCE_INT64;
    case DT_HALF: return APPLIANCE_FLOAT16;
    case DT_BFLOAT16: return APPLIANCE_BFLOAT16;
    case DT_FLOAT: return APPLIANCE_FLOAT32;
    case DT_DOUBLE: return APPLIANCE_FLOAT64;
    case DT_BOOL: return APPLIANCE_BOOL;
    default: return -1;
  }
}

absl::Status to_tf_status(const appliance_core_status& st) {
  if (st.ok) return absl::OkStatus();
  const std::string msg = st.message ? st.message : "collective failed";
  switch (st.code) {
    case APPLIANCE_MISMATCH: return absl::FailedPreconditionError(msg);
    case APPLIANCE_INVALID: return absl::InvalidArgumentError(msg);
    case APPLIANCE_SHUTDOWN: return absl::AbortedError(msg);
    default: return absl::UnknownError(msg);
  }
}

std::string op_name(const tensorflow::OpKernel& k, bool ignore_name_scope) {
  std::string name = k.name();
  if (ignore_name_scope) {
    const size_t pos = name.find_last_of('/');
    if (pos != std::string::npos) name = name.substr(pos + 1);
  }
  return name;
}

appliance_core_request describe(const tensorflow::Tensor& t, int32_t kind, std::vector<int64_t>* shape_store) {
  appliance_core_request r{};
  r.kind = kind;
  r.dtype = core_dtype(t.dtype());
  shape_store->clear();
  for (int i = 0; i < t.dims(); ++i) shape_store->push_back(t.dim_size(i));
  r.ndim = t.dims();
  r.shape = shape_store->data();
  r.data = t.tensor_data().data();
  r.device = -1;
  return r;
}

absl::Status copy_output(tensorflow::OpKernelContext* ctx, int index, appliance_core_op* op) {
  appliance_core_output o;
  api()->output(op, &o);
  tensorflow::TensorShape shape;
  for (int32_t d = 0; d < o.ndim; ++d) shape.AddDim(o.shape[d]);
  tensorflow::Tensor* out = nullptr;
  absl::Status s = ctx->allocate_output(index, shape, &out);
  if (!s.ok()) return s;
  const size_t bytes = out->tensor_data().size();
  if (bytes != o.bytes)
    return absl::InternalError("the core's output has " + std::to_string(o.bytes) + " bytes, the tensor " + std::to_string(bytes));
  if (bytes) std::memcpy(const_cast<char*>(out->tensor_data().data()), o.data, bytes);
  return absl::OkStatus();
}

void CollectiveKernel::Compute(tensorflow::OpKernelContext* ctx) {
  t_inline = true;  // every Submission made below completes before ComputeAsync returns
  ComputeAsync(ctx, [] {});
  t_inline = false;
}

bool Submission::running_inline() { return t_inline; }

void Submission::submit_inline(const appliance_core_api* a, std::vector<appliance_core_request>& reqs) {
  const int32_t n = static_cast<int32_t>(reqs.size());
  std::vector<appliance_core_op*> ops(reqs.size(), nullptr);
  char err[512] = {0};
  const int32_t enqueued = a->submit(reqs.data(), n, nullptr, nullptr, ops.data(), err, sizeof err);
  absl::Status first;
  if (enqueued < n)
    first = std::string(err).find("hvd.init()") != std::string::npos ? absl::FailedPreconditionError(err)
                                                                      : absl::InvalidArgumentError(err);
  for (int32_t i = 0; i < enqueued; ++i) {  // each waited for: the waiting caller drives the core
    appliance_core_status st;
    a->wait(ops[i], &st);
    absl::Status s = to_tf_status(st);
    if (s.ok() && finish_) s = finish_(i, ops[i]);
    a->release(ops[i]);
    if (first.ok()) first = s;
  }
  if (!first.ok()) ctx_->SetStatus(first);
  auto done = std::move(done_);
  delete this;
  done();
}

void Submission::submit(std::vector<appliance_core_request>& reqs) {
  const appliance_core_api* a = api();
  if (!a) {
    ctx_->SetStatus(absl::FailedPreconditionError(kNotInitialized));
    done_();
    delete this;
    return;
  }
  for (const appliance_core_request& r : reqs) {
    if (r.dtype < 0) {
      ctx_->SetStatus(absl::InvalidArgumentError("the collective runtime does not support this dtype"));
      done_();
      delete this;
      return;
    }
  }
  if (inline_) return submit_inline(a, reqs);
  const int32_t n = static_cast<int32_t>(reqs.size());
  pending_.store(n + 1);  // +1: this call's own hold, so no callback finishes us mid-submit
  char err[512] = {0};
  const int32_t enqueued = a->submit(reqs.data(), n, &Submission::on_done, this, nullptr, err, sizeof err);
  if (enqueued < n) {
    std::lock_guard<std::mutex> g(mu_);
    if (status_.ok())
      status_ = std::string(err).find("hvd.init()") != std::string::npos ? absl::FailedPreconditionError(err)
                                                                         : absl::InvalidArgumentError(err);
  }
  pending_.fetch_sub(n - enqueued);  // the members never enqueued call nothing
  complete_one(absl::OkStatus());
}

void Submission::on_done(void* user, int32_t index, appliance_core_op* op, const appliance_core_status* st) {
  auto* self = static_cast<Submission*>(user);
  absl::Status s = to_tf_status(*st);
  if (s.ok() && self->finish_) s = self->finish_(index, op);
  api()->release(op);
  self->complete_one(s);
}

void Submission::complete_one(const absl::Status& s) {
  if (!s.ok()) {
    std::lock_guard<std::mutex> g(mu_);
    if (status_.ok()) status_ = s;
  }
  if (pending_.fetch_sub(1) != 1) return;
  if (!status_.ok()) ctx_->SetStatus(status_);
  auto done = std::move(done_);
  delete this;
  done();
}

}  // namespace appliance_tf

// Called once from Python (appliance/tensorflow/_library.py) with the table _core.c_api()
// holds. Returns 0, or -1 when the core's door is older than this library needs.
extern "C" __attribute__((visibility("default"))) int appliance_tf_set_core_api(const void* table) {
  const auto* a = static_cast<const appliance_core_api*>(table);
  if (!a || a->abi_version < 1 || a->size_of < sizeof(appliance_core_api)) return -1;
  appliance_tf::g_api.store(a, std::memory_order_release);
  return 0;
}
