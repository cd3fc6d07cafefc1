"""Triton kernels compiled (or loaded from the disk cache) while a block runs: a step that
meets one waits for it (tens of ms for a cache load, more for a compile), so a timed loop
that meets any is not timing the kernels alone. ``with compiles() as seen: ...``: ``seen``
gets (kernel name, ``time.perf_counter()``) per kernel made ready, from any thread (Triton's
``knobs.runtime.jit_post_compile_hook``, chained to a hook already set and restored after)."""

import contextlib
import threading
import time
from typing import Iterator, List, Tuple


@contextlib.contextmanager
def compiles() -> Iterator[List[Tuple[str, float]]]:
    from triton import knobs

    seen: List[Tuple[str, float]] = []
    lock = threading.Lock()
    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, fn, **kwargs):
        with lock:
            seen.append((fn.name, time.perf_counter()))
        return previous(fn=fn, **kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield seen
    finally:
        knobs.runtime.jit_post_compile_hook = previous
