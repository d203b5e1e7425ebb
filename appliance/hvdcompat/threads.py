"""``horovod.runner.util.threads``: run a function over argument lists in threads.

``execute_function_multithreaded(fn, args_list, block_until_all_done=True,
max_concurrent_executions=1000)`` runs ``fn(*args)`` for each entry of ``args_list`` on at most
``max_concurrent_executions`` threads and, when blocking, returns ``{index: result}``; an exception
in ``fn`` makes the call raise RuntimeError naming ``fn`` (as Horovod), chained to that exception.
``in_thread(target, args=(), name=None, daemon=True, silent=False)`` starts one thread;
``on_event(event, func, args=(), stop=None, ...)`` runs ``func`` once ``event`` is set.
Owns the threads it starts; reads no environment. ``args`` must be tuples (ValueError).
"""
from __future__ import annotations

import queue
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False) -> threading.Thread:
    """Start ``target(*args)`` on a new thread and return it; ``silent`` swallows its exceptions."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args).__name__}; for a single argument use (arg,)")
    fn = target
    if silent:
        def fn(*a):
            try:
                target(*a)
            except Exception:  # noqa: BLE001 - silent=True asks for exactly this
                pass
    t = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    t.start()
    return t


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True, silent=False):
    """Run ``func(*args)`` on a thread once ``event`` is set (or never, if ``stop`` is set first)."""
    if event is None:
        raise ValueError("Event must not be None")
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args).__name__}; for a single argument use (arg,)")
    if stop is None and not daemon:
        raise ValueError("Stop event must be given for non-daemon event thread")

    def wait_then_call():
        if stop is None:
            event.wait()
        else:
            while not event.wait(check_stop_interval_s):
                if stop.is_set():
                    return
        func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)


def execute_function_multithreaded(fn, args_list, block_until_all_done=True, max_concurrent_executions=1000):
    """``{index: fn(*args_list[index])}`` computed on up to ``max_concurrent_executions`` threads;
    None (and the threads keep running as daemons) when ``block_until_all_done`` is False."""
    todo: queue.Queue = queue.Queue()
    for i, args in enumerate(args_list):
        todo.put((i, list(args)))
    results: dict = {}
    errors: list = []

    def worker():
        while True:
            try:
                i, args = todo.get(block=False)
            except queue.Empty:
                return
            try:
                results[i] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                errors.append(e)

    n = min(max_concurrent_executions, len(args_list))
    threads = [in_thread(worker, daemon=not block_until_all_done) for _ in range(n)]
    if not block_until_all_done:
        return None
    for t in threads:
        while t.is_alive():
            t.join(0.1)  # short joins keep the caller interruptible by signals
    if errors or len(results) != len(args_list):
        raise RuntimeError(f"Some threads for func {getattr(fn, '__name__', fn)} did not complete "
                           "successfully.") from (errors[0] if errors else None)
    return dict(sorted(results.items()))


__all__ = ["execute_function_multithreaded", "in_thread", "on_event"]
