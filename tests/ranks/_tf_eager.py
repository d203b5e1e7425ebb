"""Cases for tf_hvd.py: the two ways an eager allreduce reaches the core. A host tensor up to
256 KiB that no tape watches goes to the core as memory, without the op library; a larger one, or
one under a tape, goes through the op (which differentiates). Ranks on different paths pair up, and the host path gives the
op's numbers, dtypes, device and errors."""
import numpy as np
import tensorflow as tf

from appliance.tensorflow import mpi_ops

DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64)


def case_eager_paths(hvd):
    rank, size = hvd.rank(), hvd.size()
    total = size * (size + 1) // 2  # the Sum of every rank's rank + 1
    real, calls = mpi_ops._lib, []

    def counted():
        calls.append(1)
        return real()

    mpi_ops._lib = counted  # the op path is the only caller of the op library here
    try:
        for dtype in DTYPES:
            for shape in ((), (0,), (3, 5)):
                x = tf.constant(np.full(shape, rank + 1), dtype)
                y = hvd.allreduce(x, op=hvd.Sum)
                assert not calls, (dtype, shape, "took the op path")
                assert y.dtype == dtype and y.shape == shape and "CPU" in y.device, (y.dtype, y.shape, y.device)
                np.testing.assert_array_equal(y.numpy(), np.full(shape, total, dtype.as_numpy_dtype))
        x = tf.constant([rank + 1.0, 2.0])
        y = hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5)  # Average by default
        np.testing.assert_allclose(y.numpy(), [total / size, 2.0])
        assert x.numpy().tolist() == [rank + 1.0, 2.0], "the input changed"

        # rank 0 under a tape (the op path), the others on the host path: they pair up
        x = tf.constant([float(rank + 1)])
        with tf.name_scope("scoped"):
            if rank == 0:
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = hvd.allreduce(x, op=hvd.Sum)
                assert calls, "a watched tensor did not take the op path"
            else:
                y = hvd.allreduce(x, op=hvd.Sum)
        assert y.numpy().tolist() == [float(total)], y

        # above the host path's size the op path runs (no copy of a large result)
        calls.clear()
        n = mpi_ops._HOST_MAX_BYTES // 4
        assert hvd.allreduce(tf.ones([n]), op=hvd.Sum).numpy().min() == size and not calls
        assert hvd.allreduce(tf.ones([n + 1]), op=hvd.Sum).numpy().min() == size and calls

        # a shape that differs between ranks: the op's error on every rank, then the runtime goes on
        calls.clear()
        try:
            hvd.allreduce(tf.ones([2 if rank == 0 else 3]), op=hvd.Sum)
        except tf.errors.FailedPreconditionError as e:
            assert "rank" in str(e), str(e)
        else:
            raise AssertionError("a shape mismatch on the host path did not raise")
        assert not calls, "the mismatch took the op path"
        assert hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist() == [size, size]
    finally:
        mpi_ops._lib = real
    return {"eager_paths": True}


CASES = {name[5:]: fn for name, fn in dict(globals()).items() if name.startswith("case_")}
