// The scalar ops: HorovodSize, HorovodLocalSize, HorovodRank, HorovodLocalRank and
// HorovodProcessSetIncluded, evaluated when the graph runs (Horovod's size_op()...), from the
// process's runtime through the core's C door (door.h). Before hvd.init() they fail with
// FailedPrecondition naming hvd.init().
#include "door.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace appliance_tf {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

enum class Scalar { kSize, kLocalSize, kRank, kLocalRank, kIncluded };

template <Scalar W>
class ScalarOp : public OpKernel {
 public:
  explicit ScalarOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
  }

  void Compute(OpKernelContext* ctx) override {
    const appliance_core_api* a = api();
    appliance_core_topology t{};
    OP_REQUIRES(ctx, a && a->topology(&t),
                absl::FailedPreconditionError("the collective runtime has not been initialized; call hvd.init() first"));
    int32_t value = 0;
    if (W == Scalar::kLocalSize) value = t.local_size;
    if (W == Scalar::kLocalRank) value = t.local_rank;
    if (W == Scalar::kSize || W == Scalar::kRank || W == Scalar::kIncluded) {
      int32_t size = 0, rank = -1;
      const int32_t in = a->process_set(static_cast<int32_t>(process_set_id_), &size, &rank);
      OP_REQUIRES(ctx, in >= 0 || W == Scalar::kIncluded,
                  absl::InvalidArgumentError("process set " + std::to_string(process_set_id_) + " is not registered"));
      value = W == Scalar::kSize ? size : W == Scalar::kRank ? rank : (in == 1 ? 1 : 0);
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  int64_t process_set_id_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("HorovodSize").Device(tensorflow::DEVICE_CPU), ScalarOp<Scalar::kSize>);
REGISTER_KERNEL_BUILDER(Name("HorovodLocalSize").Device(tensorflow::DEVICE_CPU), ScalarOp<Scalar::kLocalSize>);
REGISTER_KERNEL_BUILDER(Name("HorovodRank").Device(tensorflow::DEVICE_CPU), ScalarOp<Scalar::kRank>);
REGISTER_KERNEL_BUILDER(Name("HorovodLocalRank").Device(tensorflow::DEVICE_CPU), ScalarOp<Scalar::kLocalRank>);
REGISTER_KERNEL_BUILDER(Name("HorovodProcessSetIncluded").Device(tensorflow::DEVICE_CPU), ScalarOp<Scalar::kIncluded>);

}  // namespace
}  // namespace appliance_tf

#define APPLIANCE_SCALAR_OP(NAME)                              \
  REGISTER_OP(NAME)                                            \
      .Attr("process_set_id: int = 0")                         \
      .Output("value: int32")                                  \
      .SetIsStateful()                                         \
      .SetShapeFn(tensorflow::shape_inference::ScalarShape)

APPLIANCE_SCALAR_OP("HorovodSize");
APPLIANCE_SCALAR_OP("HorovodLocalSize");
APPLIANCE_SCALAR_OP("HorovodRank");
APPLIANCE_SCALAR_OP("HorovodLocalRank");
APPLIANCE_SCALAR_OP("HorovodProcessSetIncluded");
