// The collectives whose output the core sizes beyond allgather: reducescatter and grouped
// reducescatter (each rank's share of the reduction, rows split as evenly as the ranks allow),
// alltoall (rows sent to each rank as `splits` says; the rows received from each come back as
// received_splits), and join (the last rank to join). AsyncOpKernels over the C door (door.h), as in collectives.cc.
#include <vector>

#include "door.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace appliance_tf {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Reducescatter, and grouped reducescatter (one group of num_tensors members).
class ReducescatterOp : public CollectiveKernel {
 public:
  explicit ReducescatterOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    if (c->HasAttr("num_tensors")) OP_REQUIRES_OK(c, c->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const std::string base = op_name(*this, ignore_name_scope_);
    std::vector<std::string> names(num_tensors_);
    std::vector<std::vector<int64_t>> shapes(num_tensors_);
    std::vector<appliance_core_request> reqs(num_tensors_);
    for (int i = 0; i < num_tensors_; ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES_ASYNC(ctx, in.dims() > 0, absl::InvalidArgumentError("reducescatter needs a tensor of rank 1 or more"), done);
      reqs[i] = describe(in, APPLIANCE_REDUCESCATTER, &shapes[i]);
      reqs[i].reduce_op = reduce_op_;
      reqs[i].prescale = prescale_;
      reqs[i].postscale = postscale_;
      reqs[i].process_set = static_cast<int32_t>(process_set_id_);
      names[i] = num_tensors_ > 1 ? base + "_" + std::to_string(i) : base;
      reqs[i].name = names[i].c_str();
    }
    auto finish = [ctx](int32_t index, appliance_core_op* op) { return copy_output(ctx, index, op); };
    (new Submission(ctx, std::move(done), finish))->submit(reqs);
  }

 private:
  bool ignore_name_scope_ = false;
  int64_t process_set_id_ = 0;
  int reduce_op_ = APPLIANCE_SUM;
  float prescale_ = 1.0f, postscale_ = 1.0f;
  int num_tensors_ = 1;
};

class AlltoallOp : public CollectiveKernel {
 public:
  explicit AlltoallOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, in.dims() > 0, absl::InvalidArgumentError("alltoall needs a tensor of rank 1 or more"), done);
    OP_REQUIRES_ASYNC(ctx, splits.dims() == 1, absl::InvalidArgumentError("alltoall's splits must be a vector"), done);
    const std::string name = op_name(*this, ignore_name_scope_);
    std::vector<int64_t> shape, sends;
    auto s = splits.vec<int32_t>();
    for (int64_t i = 0; i < s.size(); ++i) sends.push_back(s(i));
    std::vector<appliance_core_request> reqs{describe(in, APPLIANCE_ALLTOALL, &shape)};
    reqs[0].process_set = static_cast<int32_t>(process_set_id_);
    reqs[0].name = name.c_str();
    reqs[0].splits = sends.data();  // empty: rows split evenly
    reqs[0].nsplits = static_cast<int32_t>(sends.size());
    auto finish = [ctx](int32_t, appliance_core_op* op) -> absl::Status {
      absl::Status st = copy_output(ctx, 0, op);
      if (!st.ok()) return st;
      appliance_core_output o;
      api()->output(op, &o);
      Tensor* received = nullptr;
      st = ctx->allocate_output(1, TensorShape({o.nsplits}), &received);
      if (!st.ok()) return st;
      auto r = received->vec<int32_t>();
      for (int32_t i = 0; i < o.nsplits; ++i) r(i) = static_cast<int32_t>(o.splits[i]);
      return absl::OkStatus();
    };
    (new Submission(ctx, std::move(done), finish))->submit(reqs);
  }

 private:
  bool ignore_name_scope_ = false;
  int64_t process_set_id_ = 0;
};

class JoinOp : public CollectiveKernel {
 public:
  explicit JoinOp(OpKernelConstruction* c) : CollectiveKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<appliance_core_request> reqs(1);
    reqs[0] = appliance_core_request{};
    reqs[0].kind = APPLIANCE_JOIN;
    reqs[0].dtype = APPLIANCE_UINT8;
    reqs[0].device = -1;
    auto finish = [ctx](int32_t, appliance_core_op* op) -> absl::Status {
      appliance_core_output o;
      api()->output(op, &o);
      Tensor* out = nullptr;
      absl::Status st = ctx->allocate_output(0, TensorShape({}), &out);
      if (st.ok()) out->scalar<int32_t>()() = static_cast<int32_t>(o.value);
      return st;
    };
    (new Submission(ctx, std::move(done), finish))->submit(reqs);
  }
};

REGISTER_KERNEL_BUILDER(Name("HorovodReducescatter").Device(tensorflow::DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedReducescatter").Device(tensorflow::DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("HorovodAlltoall").Device(tensorflow::DEVICE_CPU).HostMemory("splits").HostMemory("received_splits"), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("HorovodJoin").Device(tensorflow::DEVICE_CPU), JoinOp);

}  // namespace
}  // namespace appliance_tf

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("HorovodReducescatter")
    .Attr("T: {uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64}")
    .Attr("reduce_op: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](InferenceContext* c) {
      if (InferenceContext::Rank(c->input(0)) == 0) return absl::InvalidArgumentError("reducescatter needs a tensor of rank 1 or more");
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

REGISTER_OP("HorovodGroupedReducescatter")
    .Attr("T: {uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64}")
    .Attr("reduce_op: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("num_tensors: int >= 1")
    .Attr("process_set_id: int = 0")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Input("tensors: num_tensors*T")
    .Output("outputs: num_tensors*T")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) {
        if (InferenceContext::Rank(c->input(i)) == 0) return absl::InvalidArgumentError("reducescatter needs a tensor of rank 1 or more");
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(i), 0, c->UnknownDim(), &out));
        c->set_output(i, out);
      }
      return absl::OkStatus();
    });

REGISTER_OP("HorovodAlltoall")
    .Attr("T: {uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool}")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("HorovodJoin")
    .Output("output: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });
