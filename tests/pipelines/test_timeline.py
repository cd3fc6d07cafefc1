"""The end to end's device timeline: segments by what ran, from a profiler's events."""

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from pipelines.bench.e2e import DENSE, TBE_BACKWARD, TBE_FORWARD, _timeline_lines, device_timeline
from pipelines.bench.timeline import IDLE, JOIN, alone_and_shared, device_intervals, timeline_breakdown


def test_segments_split_the_window_by_what_ran():
    intervals = [(0, 100, "dense"), (50, 130, "tbe"), (130, 150, "tbe"), (200, 260, "dense"), (210, 220, "dense")]
    out = timeline_breakdown(intervals, steps=2)
    both = JOIN.join(["dense", "tbe"])
    # 0-50 dense, 50-100 both, 100-150 tbe, 150-200 idle, 200-260 dense (a nested kernel adds nothing)
    assert out["segments_ms"] == pytest.approx({"dense": (50 + 60) / 2e3, both: 50 / 2e3, "tbe": 50 / 2e3,
                                                IDLE: 50 / 2e3})  # fmt: skip
    assert out["window_ms"] == pytest.approx(260 / 2e3)
    assert sum(out["segments_ms"].values()) == pytest.approx(out["window_ms"])
    assert list(out["segments_ms"])[0] == "dense"  # largest first
    assert alone_and_shared(out, "tbe") == pytest.approx((0.025, 0.025))
    assert alone_and_shared(out, "dense") == pytest.approx((0.055, 0.025))
    assert alone_and_shared(out, "other") == (0.0, 0.0)


def test_back_to_back_kernels_do_not_overlap_and_empty_input_is_an_empty_window():
    out = timeline_breakdown([(0, 10, "a"), (10, 20, "b")], steps=1)
    assert out["segments_ms"] == pytest.approx({"a": 0.01, "b": 0.01})
    assert timeline_breakdown([], steps=3) == {"steps": 3, "window_ms": 0.0, "segments_ms": {}}
    with pytest.raises(ValueError, match="steps"):
        timeline_breakdown([(0, 1, "a")], steps=0)


def _host(event_id, name, parent=None):
    event = FunctionEvent(id=event_id, name=name, thread=0, start_us=0, end_us=1000, device_type=DeviceType.CPU)
    event.cpu_parent = parent
    return event


def _kernel(event_id, name, start, end, launched_by):
    return FunctionEvent(id=event_id, name=name, thread=0, start_us=start, end_us=end, device_type=DeviceType.CUDA,
                         linked_correlation_id=launched_by)  # fmt: skip


def test_device_events_take_the_group_of_the_host_op_that_launched_them():
    # torch's own FunctionEvent: the fields the timeline reads exist under these names.
    step = _host(1, "## forward ##")
    lookup = _host(2, "tbe_plugin::lookup", step)
    update = _host(3, "tbe_plugin::fused_update", _host(4, "autograd::engine::evaluate_function: _FusedLookupBackward"))
    gemm = _host(5, "aten::addmm", step)
    events = [step, lookup, update, gemm,
              _kernel(10, "_warp_pooled_forward_kernel", 0, 40, 2), _kernel(11, "gemm", 30, 100, 5),
              _kernel(12, "_pieces_kernel", 100, 160, 3), _kernel(13, "gemm", 170, 180, 99)]  # 99: no host op
    group_of = lambda name, host: (host.name if host is not None else "unlinked") + ":" + name  # noqa: E731
    assert sorted(device_intervals(events, group_of)) == [
        (0, 40, "tbe_plugin::lookup:_warp_pooled_forward_kernel"), (30, 100, "aten::addmm:gemm"),
        (100, 160, "tbe_plugin::fused_update:_pieces_kernel"), (170, 180, "unlinked:gemm")]  # fmt: skip
    out = device_timeline(events, steps=1)  # the end to end's groups
    assert out["segments_ms"] == pytest.approx({TBE_FORWARD: 0.03, JOIN.join([TBE_FORWARD, DENSE]): 0.01,
                                                DENSE: 0.06 + 0.01, TBE_BACKWARD: 0.06, IDLE: 0.01})  # fmt: skip
    lines = "\n".join(_timeline_lines({"triton": {"timeline": out}}, steps=1))
    assert "| TBE backward | 0.060 |" in lines and "| TBE forward: alone / beside others | 0.030 / 0.010 |" in lines


def test_only_kernels_copies_and_fills_occupy_the_device():
    """Annotation ranges and syncs are device events too: counted, TBE forward alone would vanish
    under the phase's range (a review found it)."""
    step = _host(1, "## forward ##")
    lookup = _host(2, "tbe_plugin::lookup", step)
    gemm = _host(3, "aten::addmm", step)
    runtime = FunctionEvent(id=2, name="cudaLaunchKernel", thread=0, start_us=0, end_us=1, device_type=DeviceType.CPU,
                            linked_correlation_id=77)  # CUPTI's numbering: its id may equal an op's
    runtime.cpu_parent = _host(9, "aten::empty")
    frame = FunctionEvent(id=0, name="train.py(12): step", thread=0, start_us=0, end_us=1, device_type=DeviceType.CPU)
    typed = [_kernel(10, "_warp_pooled_forward_kernel", 0, 40, 2), _kernel(11, "gemm", 40, 90, 3),
             _kernel(12, "## forward ##", 0, 100, 1), _kernel(13, "Context Sync", 90, 100, 0)]  # fmt: skip
    for event, kind in zip(typed, ("kernel", "kernel", "gpu_user_annotation", "cuda_sync")):
        event.activity_type = kind
    expected = {TBE_FORWARD: 0.04, DENSE: 0.05}
    events = [step, lookup, gemm, runtime, frame] + typed
    assert device_timeline(events, steps=1)["segments_ms"] == pytest.approx(expected)
    for event in typed:  # a profiler without activity types: the annotation by its op's name, the sync by its name
        event.activity_type = None
    assert device_timeline(events, steps=1)["segments_ms"] == pytest.approx(expected)
    typed[2].name, typed[2].is_user_annotation = "a range", True
    assert device_timeline(events, steps=1)["segments_ms"] == pytest.approx(expected)


def test_without_links_kernels_find_their_op_by_name_and_duration():
    """torch 2.11 (the device's) sets no linked_correlation_id on device events; the ops still list
    their kernels with the same name and duration (the H200 run at cd7e699 found no link)."""
    step = _host(1, "## forward ##")
    lookup, gemm, update = _host(2, "tbe_plugin::lookup", step), _host(3, "aten::addmm", step), _host(
        4, "tbe_plugin::fused_update", _host(5, "autograd::engine::evaluate_function: _FusedLookupBackward"))
    lookup.time_range.start, gemm.time_range.start, update.time_range.start = 0, 1, 2
    kernels = [_kernel(10, "_warp_pooled_forward_kernel", 0, 40, 0), _kernel(11, "gemm", 40, 90, 0),
               _kernel(12, "gemm", 100, 150, 0), _kernel(13, "_pieces_kernel", 150, 170, 0)]  # fmt: skip
    for op, k in ((lookup, kernels[0]), (gemm, kernels[1]), (update, kernels[2]), (update, kernels[3])):
        op.append_kernel(k.name, 0, k.time_range.end - k.time_range.start)  # as torch's parser does
    # torch 2.11: the runtime's events inside an op carry its id and its kernels (seen on the H200)
    loading = _host(2, "Lazy Function Loading", None)
    loading.time_range.start = 0.5
    loading.append_kernel("_warp_pooled_forward_kernel", 0, 40)
    out = device_timeline([step, lookup, gemm, loading, update] + kernels, steps=1)["segments_ms"]
    # the second gemm, in the update op (same name and duration as the first): the backward's
    assert out == pytest.approx({TBE_FORWARD: 0.04, DENSE: 0.05, TBE_BACKWARD: 0.07, IDLE: 0.01})


def test_device_events_linked_to_no_host_op_are_an_error_not_a_guess():
    with pytest.raises(ValueError, match="none of 2 device events links"):
        device_intervals([_host(1, "aten::sort"), _kernel(2, "radix", 0, 5, 0), _kernel(3, "radix", 5, 9, 7)],
                         lambda name, host: name)  # fmt: skip
    assert "none of 1 device events" in device_timeline([_kernel(2, "radix", 0, 5, 0)], steps=1)["error"]


def test_events_without_the_fields_are_reported_not_raised():
    broken = device_timeline([object()], steps=1)
    assert "error" in broken and "AttributeError" in broken["error"]
    lines = _timeline_lines({"fbgemm": {"timeline": broken}}, steps=1)
    assert lines[1] == "Device timeline: not measured" and lines[2].startswith("- fbgemm: AttributeError")


def test_a_real_cpu_profile_has_no_device_window():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(8, 8) @ torch.ones(8, 8)
    assert device_timeline(prof.events(), steps=1) == {"steps": 1, "window_ms": 0.0, "segments_ms": {}}
