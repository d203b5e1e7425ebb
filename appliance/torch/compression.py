"""Gradient compression for allreduce, as ``horovod.torch.compression``.

A compressor is a pair of static methods: ``compress(tensor) -> (tensor, ctx)`` before the
allreduce and ``decompress(tensor, ctx) -> tensor`` after it. ``Compression.none`` passes
tensors through; ``Compression.fp16`` sends floating-point tensors as float16 and restores
their dtype afterwards (integer and bool tensors pass unchanged). No state, no environment.
"""
from __future__ import annotations

import torch


class Compressor:
    """Interface: compress before the collective, decompress after it."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The default: tensors travel as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; ctx is the original dtype."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.type(ctx)
        return tensor


class Compression:
    """The compression algorithms an allreduce can use."""

    none = NoneCompressor
    fp16 = FP16Compressor
