"""Horovod's gradient compression for TensorFlow: ``Compression.none`` and ``Compression.fp16``
(floating tensors travel as float16 and come back in their own dtype; other dtypes unchanged).
Pure TensorFlow, no state."""
import tensorflow as tf


class Compressor:
    """Compresses a tensor before the collective and decompresses it after."""

    @staticmethod
    def compress(tensor):
        """(the tensor to send, the context decompress needs)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, dtype=tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, dtype=ctx) if ctx.is_floating else tensor


class Compression:
    """The compressors by Horovod's names."""

    none = NoneCompressor
    fp16 = FP16Compressor
