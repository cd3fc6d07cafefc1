"""Where a step's device time goes on the timeline, not in sums of kernel durations.

The end to end's per-group sums (``e2e.kernel_breakdown``) add every kernel's duration: a
kernel on a side stream that runs beside a dense one counts in full, and so does the dense
one, each slowed by the other. At 692138f our "TBE forward" summed 2.28 ms a step, the
backward's plan included, most of it beside dense kernels: the sums (13.13 ms) exceeded the
step (12.59). Here the profiled steps' device activity (kernels, copies, fills) is cut at
every start and end into segments, and each segment goes to what ran during it: nothing
(the device idle), one group alone, or several groups at once. A group's time alone is what
the step would lose without it if the rest stayed as it is; overlapped time is shared.

``device_intervals(events, group_of)`` takes a profiler's events (torch's ``FunctionEvent``s:
device ones carry ``time_range`` and ``linked_correlation_id``, the id of the host op that
launched them) and ``group_of(kernel_name, host_event)`` (the end to end's ``kernel_group``
over the host op's chain), and gives the intervals that ``timeline_breakdown(intervals,
steps)`` cuts. Only kernels, copies and fills count: the device-side ranges of
``record_function`` annotations (a whole phase, gaps included) and synchronizations are
device events too, and are left out.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

from torch.autograd import DeviceType

IDLE = "idle"
# Kineto's activity types of device work; annotations ("gpu_user_annotation") and syncs
# ("cuda_sync") are device events that occupy nothing.
DEVICE_WORK = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
# Names of kineto's synchronization events, for profilers whose events carry no activity type.
SYNC_SUFFIX = " Sync"
# What joins the names of groups that ran at once ("TBE forward + dense").
JOIN = " + "


def device_intervals(events: Any, group_of: Callable[[str, Optional[Any]], str]) -> List[Tuple[float, float, str]]:
    """(start us, end us, group) of every device event (kernel, copy, fill) in ``events``;
    its group from its name and the host op that launched it (None where it links to none)."""
    host = {}
    device = []
    for event in events:
        if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU:
            device.append(event)
        elif not getattr(event, "is_async", False) and not getattr(event, "linked_correlation_id", 0) \
                and event.id > 0:  # fmt: skip
            # Ops (torch's frontend events), as torch links kernels to them: not the runtime's
            # calls (cudaLaunchKernel: linked, numbered by CUPTI), not Python frames (id 0).
            # Without links (torch 2.11) the runtime's events inside an op share its id and its
            # kernels: the op is the earliest to start.
            known = host.get(event.id)
            if known is None or event.time_range.start < known.time_range.start:
                host[event.id] = event
    by_kernel = _launchers_by_kernel(host.values(), device)
    out, linked = [], 0
    for event in sorted(device, key=lambda e: e.time_range.start):
        launcher = host.get(getattr(event, "linked_correlation_id", 0))
        if launcher is None and by_kernel:
            launcher = _pop(by_kernel, (event.name, event.time_range.end - event.time_range.start))
        if not _is_work(event, launcher):
            continue
        linked += launcher is not None
        start, end = event.time_range.start, event.time_range.end
        if end > start:
            out.append((start, end, group_of(event.name, launcher)))
    if out and not linked:  # grouped by name alone, FBGEMM's generic kernels would read as dense
        raise ValueError(f"none of {len(out)} device events links to a host op (linked_correlation_id)")
    return out


def _launchers_by_kernel(host: Any, device: List[Any]) -> Dict[Tuple[str, float], List[Any]]:
    """Where the device events carry no link (torch before ``FunctionEvent.linked_correlation_id``):
    each host op under the (name, duration) of every kernel torch appended to it (``kernels``:
    the same name and the same end-minus-start as the device event), in the order of the ops'
    starts; empty where the links are there."""
    if any(getattr(event, "linked_correlation_id", 0) for event in device):
        return {}
    found: Dict[Tuple[str, float], List[Any]] = {}
    for op in sorted(host, key=lambda e: e.time_range.start):
        for kernel in getattr(op, "kernels", ()):
            found.setdefault((kernel.name, kernel.duration), []).append(op)
    for ops in found.values():
        ops.reverse()  # popped from the end: the earliest op first
    return found


def _pop(found: Dict[Tuple[str, float], List[Any]], key: Tuple[str, float]) -> Optional[Any]:
    ops = found.get(key)
    return ops.pop() if ops else None


def _is_work(event: Any, launcher: Optional[Any]) -> bool:
    """A kernel, copy or fill, not an annotation's device range or a synchronization."""
    kind = getattr(event, "activity_type", None)
    if kind is not None:
        return kind in DEVICE_WORK
    if getattr(event, "is_user_annotation", False):
        return False
    if launcher is not None and event.name == launcher.name:  # an annotation's range, named as its op
        return False
    return not event.name.endswith(SYNC_SUFFIX)


def segments(intervals: List[Tuple[float, float, str]]) -> Tuple[Dict[str, float], float]:
    """The window (first start to last end) of ``intervals`` cut at every start and end: the
    time (in the intervals' unit) of each ``idle``, group alone, or groups at once (names
    sorted, joined by ``JOIN``), and the window's length. Nested or overlapping intervals
    of one group count once."""
    if not intervals:
        return {}, 0.0
    edges = sorted([(start, 1, group) for start, _, group in intervals] +
                   [(end, -1, group) for _, end, group in intervals])  # fmt: skip
    active: Dict[str, int] = {}
    found: Dict[str, float] = {}
    last = edges[0][0]
    for t, step, group in edges:
        if t > last:
            running = sorted(g for g, n in active.items() if n > 0)
            key = JOIN.join(running) if running else IDLE
            found[key] = found.get(key, 0.0) + (t - last)
            last = t
        active[group] = active.get(group, 0) + step
    return found, edges[-1][0] - edges[0][0]


def timeline_breakdown(intervals: List[Tuple[float, float, str]], steps: int) -> Dict[str, Any]:
    """Per step, ms of the window (first start to last end, intervals in us) split by what
    ran (``segments``), largest first."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    found, window = segments(intervals)
    per_step = {k: v / 1e3 / steps for k, v in sorted(found.items(), key=lambda kv: -kv[1])}
    return {"steps": steps, "window_ms": window / 1e3 / steps, "segments_ms": per_step}


def alone_and_shared(breakdown: Dict[str, Any], group: str) -> Tuple[float, float]:
    """(ms a step ``group`` ran alone, ms it ran beside other groups)."""
    alone = shared = 0.0
    for key, ms in breakdown.get("segments_ms", {}).items():
        names = key.split(JOIN)
        if names == [group]:
            alone += ms
        elif group in names:
            shared += ms
    return alone, shared
