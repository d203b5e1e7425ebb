// The collective kernels: AsyncOpKernels that submit through the core's C door (door.h) and
// return; the core's completion callback finishes them. So every collective of a step is in
// flight at once, and the core fuses them. CPU kernels (GPU tensors reach them through
// TensorFlow's placement: a host copy).
//
// HorovodAllreduce, HorovodGroupedAllreduce, HorovodAllgather, HorovodGroupedAllgather,
// HorovodBroadcast: Horovod's op
// names, inputs and attributes (its Python gradient functions and graphs name them so).
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

// Attributes every collective shares.
struct Common {
  bool ignore_name_scope = false;
  int64_t process_set_id = 0;
  void read(OpKernelConstruction* c) {
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id));
  }
};

class AllreduceOp : public CollectiveKernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    common_.read(c);
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
    if (c->HasAttr("num_tensors")) OP_REQUIRES_OK(c, c->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const std::string base = op_name(*this, common_.ignore_name_scope);
    std::vector<std::string> names(num_tensors_);
    std::vector<std::vector<int64_t>> shapes(num_tensors_);
    std::vector<appliance_core_request> reqs(num_tensors_);
    for (int i = 0; i < num_tensors_; ++i) {
      const Tensor& in = ctx->input(i);
      Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({i}, i, in.shape(), &out), done);
      reqs[i] = describe(in, APPLIANCE_ALLREDUCE, &shapes[i]);
      reqs[i].out = const_cast<char*>(out->tensor_data().data());
      reqs[i].reduce_op = reduce_op_;
      reqs[i].prescale = prescale_;
      reqs[i].postscale = postscale_;
      reqs[i].process_set = static_cast<int32_t>(common_.process_set_id);
      names[i] = num_tensors_ > 1 ? base + "_" + std::to_string(i) : base;
      reqs[i].name = names[i].c_str();
    }
    (new Submission(ctx, std::move(done)))->submit(reqs);
  }

 private:
  Common common_;
  int reduce_op_ = APPLIANCE_SUM;
  float prescale_ = 1.0f, postscale_ = 1.0f;  // TF attrs have no double
  int num_tensors_ = 1;
};

class BroadcastOp : public CollectiveKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    common_.read(c);
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
    const std::string name = op_name(*this, common_.ignore_name_scope);
    std::vector<int64_t> shape;
    std::vector<appliance_core_request> reqs{describe(in, APPLIANCE_BROADCAST, &shape)};
    reqs[0].out = const_cast<char*>(out->tensor_data().data());
    reqs[0].root = static_cast<int32_t>(root_);
    reqs[0].process_set = static_cast<int32_t>(common_.process_set_id);
    reqs[0].name = name.c_str();
    (new Submission(ctx, std::move(done)))->submit(reqs);
  }

 private:
  Common common_;
  int64_t root_ = 0;
};

// Allgather (and grouped allgather: one group of num_tensors members): the outputs' first
// dimensions are known once every rank's are (after negotiation); the core keeps each output and
// the callback copies it into the kernel's.
class AllgatherOp : public CollectiveKernel {
 public:
  explicit AllgatherOp(OpKernelConstruction* c) : CollectiveKernel(c) {
    common_.read(c);
    if (c->HasAttr("num_tensors")) OP_REQUIRES_OK(c, c->GetAttr("num_tensors", &num_tensors_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const std::string base = op_name(*this, common_.ignore_name_scope);
    std::vector<std::string> names(num_tensors_);
    std::vector<std::vector<int64_t>> shapes(num_tensors_);
    std::vector<appliance_core_request> reqs(num_tensors_);
    for (int i = 0; i < num_tensors_; ++i) {
      const Tensor& in = ctx->input(i);
      OP_REQUIRES_ASYNC(ctx, in.dims() > 0, absl::InvalidArgumentError("allgather needs a tensor of rank 1 or more"), done);
      reqs[i] = describe(in, APPLIANCE_ALLGATHER, &shapes[i]);
      reqs[i].process_set = static_cast<int32_t>(common_.process_set_id);
      names[i] = num_tensors_ > 1 ? base + "_" + std::to_string(i) : base;
      reqs[i].name = names[i].c_str();
    }
    auto finish = [ctx](int32_t index, appliance_core_op* op) { return copy_output(ctx, index, op); };
    (new Submission(ctx, std::move(done), finish))->submit(reqs);
  }

 private:
  Common common_;
  int num_tensors_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("HorovodAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("HorovodBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("HorovodAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("HorovodGroupedAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);

}  // namespace
}  // namespace appliance_tf

// --- the ops' signatures ----------------------------------------------------------------------
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define APPLIANCE_REDUCE_TYPES "T: {uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64}"
// The ops that only move bytes also take uint16 (Horovod's), carried as int16.
#define APPLIANCE_ALL_TYPES "T: {uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool}"
#define APPLIANCE_COMMON_ATTRS .Attr("ignore_name_scope: bool = False").Attr("process_set_id: int = 0")

REGISTER_OP("HorovodAllreduce")
    .Attr(APPLIANCE_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    APPLIANCE_COMMON_ATTRS
    .Input("tensor: T")
    .Output("sum: T")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });

REGISTER_OP("HorovodGroupedAllreduce")
    .Attr(APPLIANCE_REDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    APPLIANCE_COMMON_ATTRS
    .Attr("num_tensors: int >= 1")
    .Input("tensors: num_tensors*T")
    .Output("sum: num_tensors*T")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    });

REGISTER_OP("HorovodAllgather")
    .Attr(APPLIANCE_ALL_TYPES)
    APPLIANCE_COMMON_ATTRS
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

REGISTER_OP("HorovodGroupedAllgather")
    .Attr(APPLIANCE_ALL_TYPES)
    APPLIANCE_COMMON_ATTRS
    .Attr("num_tensors: int >= 1")
    .Input("tensors: num_tensors*T")
    .Output("outputs: num_tensors*T")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(i), 0, c->UnknownDim(), &out));
        c->set_output(i, out);
      }
      return absl::OkStatus();
    });

REGISTER_OP("HorovodBroadcast")
    .Attr(APPLIANCE_ALL_TYPES)
    .Attr("root_rank: int")
    APPLIANCE_COMMON_ATTRS
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    });
