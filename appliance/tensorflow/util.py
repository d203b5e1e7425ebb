"""Small TensorFlow helpers by Horovod's names (``horovod.tensorflow.util``): whether this code runs
eagerly, a function made a graph (``tf.function``), a per-mode memo of a builder, and variables
as hashable references and back. Scripts and Horovod's own tests import them from there. Pure
TensorFlow, no state beyond each memo; no environment; no failure modes of their own."""
import tensorflow as tf


def executing_eagerly() -> bool:
    """True when eager execution is on here (outside any graph being built)."""
    return tf.executing_eagerly()


_executing_eagerly = executing_eagerly  # Horovod's name


def _make_subgraph(f):
    """``f`` as one graph function, so the ops it runs are in flight together."""
    return tf.function(f)


def _cache(f):
    """``f`` memoised by its (hashable) arguments and the execution mode."""
    memo = {}

    def cached(*args):
        key = (args, executing_eagerly())
        if key not in memo:
            memo[key] = f(*args)
        return memo[key]

    return cached


def vars_to_refs(variables):
    """Variables (nested lists) as hashable references (tuples)."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The inverse of ``vars_to_refs``."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
