"""Triton kernels compiled (or loaded from the disk cache) while a block runs: a step that
meets one waits for it (tens of ms for a cache load, more for a compile), so a timed loop
that meets any is not timing the kernels alone. ``with compiles() as seen: ...``: ``seen``
gets the name of each kernel made ready, from any thread (Triton's
``knobs.runtime.jit_post_compile_hook``, chained to a hook already set and restored after)."""

import contextlib
from typing import Iterator, List


@contextlib.contextmanager
def compiles() -> Iterator[List[str]]:
    from triton import knobs

    seen: List[str] = []  # list.append is atomic: hooks from several threads are safe
    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, fn, **kwargs):
        seen.append(fn.name)
        return previous(fn=fn, **kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield seen
    finally:
        knobs.runtime.jit_post_compile_hook = previous
