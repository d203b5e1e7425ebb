// The op library's side of the core's C door (appliance/runtime/csrc/capi/appliance_core.h):
// the table, given once at load by Python (appliance_tf_set_core_api, through ctypes), the
// kernels' base (CollectiveKernel) and the one way they submit: Submission, which completes a
// kernel from the core's callback, or, run eagerly, on the calling thread.
//
// Failure modes: a kernel run before the table is set, or before hvd.init(), fails with
// FailedPrecondition naming hvd.init(); a refused submit fails the kernel with the core's line;
// an operation that fails later fails its kernel with the status mapped by to_tf_status().
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "appliance_core.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace appliance_tf {

// The table (nullptr until Python set it).
const appliance_core_api* api();
// The core's code for a TF dtype; -1 when the core has none.
int core_dtype(tensorflow::DataType t);
// A core status as a TF error: mismatch -> FailedPrecondition, refused -> InvalidArgument,
// shutdown -> Aborted, every failure of the job -> Unknown (Horovod's), so hvd.elastic sees it.
absl::Status to_tf_status(const appliance_core_status& st);
// The collective's name: the kernel's node name, without its scopes when asked (Horovod's rule).
std::string op_name(const tensorflow::OpKernel& k, bool ignore_name_scope);
// The request describing `t` (its shape kept in `shape_store`, which must outlive the submit).
appliance_core_request describe(const tensorflow::Tensor& t, int32_t kind, std::vector<int64_t>* shape_store);

// The output the core kept for `op` (allgather, alltoall, reducescatter) copied into the
// kernel's output `index`, allocated with the core's shape.
absl::Status copy_output(tensorflow::OpKernelContext* ctx, int index, appliance_core_op* op);

// The collective kernels' base: an AsyncOpKernel whose synchronous Compute() runs the op on the
// calling thread. TensorFlow's graph executors (tf.function, v1 sessions) call ComputeAsync(), so
// a step's ops are in flight together and fuse; its eager runtime calls Compute(), one op at a
// time, and waits for it. There the op is submitted and waited for through the door's wait(),
// whose caller drives the core itself (APPLIANCE_SPIN_US), so an eager op costs no hand-off to
// the core's thread and back (AsyncOpKernel's own Compute waits on a Notification the core's
// thread would have to signal).
class CollectiveKernel : public tensorflow::AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void Compute(tensorflow::OpKernelContext* ctx) override;
};

// One kernel's operations in flight: submits them (a group when more than one), and when the
// last completes runs `finish` (for outputs the core kept) unless one failed, sets the
// kernel's status and calls done(). Deletes itself. Inside CollectiveKernel::Compute it waits
// for them on the calling thread and calls done() before submit() returns.
class Submission {
 public:
  using Finish = std::function<absl::Status(int32_t index, appliance_core_op* op)>;
  Submission(tensorflow::OpKernelContext* ctx, tensorflow::AsyncOpKernel::DoneCallback done, Finish finish = nullptr)
      : ctx_(ctx), done_(std::move(done)), finish_(std::move(finish)), inline_(running_inline()) {}
  // Submits reqs; on a refusal the kernel fails with the core's message (after the members
  // already enqueued complete).
  void submit(std::vector<appliance_core_request>& reqs);

 private:
  static bool running_inline();  // inside CollectiveKernel::Compute on this thread
  void submit_inline(const appliance_core_api* a, std::vector<appliance_core_request>& reqs);
  static void on_done(void* user, int32_t index, appliance_core_op* op, const appliance_core_status* st);
  void complete_one(const absl::Status& s);

  tensorflow::OpKernelContext* ctx_;
  tensorflow::AsyncOpKernel::DoneCallback done_;
  Finish finish_;
  const bool inline_;
  std::atomic<int> pending_{0};
  std::mutex mu_;
  absl::Status status_;  // the first failure
};

}  // namespace appliance_tf
