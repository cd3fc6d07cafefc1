"""The end-to-end benchmark: its CPU smoke run (both backends, the pipelines CPU runs), the
kernel grouping of its profile, and the per-table tables it trains (config, batches, app)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd.profiler_util import Kernel

from pipelines.app.config import ConfigError, DataConfig, TableSpec, TablesConfig
from pipelines.app.data import WorkloadClickLog, rows_per_table
from pipelines.bench.e2e import (
    DENSE, GROUPS, OTHER, TBE_BACKWARD, TBE_FORWARD, UNATTRIBUTED_TBE, host_waits, kernel_breakdown, kernel_group,
    kernel_records, parse_backends,
)  # fmt: skip
from tbe_plugin.workloads import ctr_tables_dlrm

ROOT = Path(__file__).resolve().parents[2]


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK")}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    command = [sys.executable, "-m", "pipelines.bench.e2e", "--smoke", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "e2e.json").read_text()), (out / "e2e.md").read_text()


def test_smoke_run_measures_every_pipeline_of_both_backends(smoke):
    results, markdown = smoke
    ran = {f"{b}/{p}" for b in ("fbgemm", "triton") for p in ("sparsedist", "stale0", "stale1")}
    assert set(results["runs"]) == ran
    assert set(results["skipped"]) == {"fbgemm/semisync", "triton/semisync"}  # TorchRec's SemiSync: CUDA only
    for key, r in results["runs"].items():
        assert r["ms"] > 0 and r["examples_per_s"] > 0 and r["median_ms"] > 0, key
        assert len(r["losses"]) == 3 and len(r["step_ms"]) == 2, key  # 1 warm-up + 2 timed steps
        # On the CPU a step runs in its call: the call's host time is inside the step's marks.
        assert len(r["host_ms"]) == 2 and all(0 < h <= s + 1e-3 for h, s in zip(r["host_ms"], r["step_ms"])), key
        assert r["compiles_timed"] == [], key  # the interpreter compiles nothing
        assert r["plan"] == {"table_wise/" + ("fused" if key.startswith("fbgemm") else "fused_triton"): 4}, key
    for pipeline in ("sparsedist", "stale0", "stale1"):
        s, runs = results["summary"][pipeline], results["runs"]
        rates = [runs[f"{backend}/{pipeline}"]["examples_per_s"] for backend in ("fbgemm", "triton")]
        assert s["examples_per_s_ratio"] == pytest.approx(rates[1] / rates[0])
        medians = [runs[f"{backend}/{pipeline}"]["median_ms"] for backend in ("fbgemm", "triton")]
        assert s["median_ratio"] == pytest.approx(medians[0] / medians[1])
        assert s["loss_diff_backends"] < 1e-4, (pipeline, s)  # same weights, batches and semantics
    for backend in ("fbgemm", "triton"):
        runs = {p: results["runs"][f"{backend}/{p}"]["losses"] for p in ("sparsedist", "stale0", "stale1")}
        assert results["summary"][backend]["loss_diff_stale0_vs_sparsedist"] == 0.0  # k = 0 is SparseDist, bitwise
        assert runs["stale1"][0] == runs["sparsedist"][0] and runs["stale1"] != runs["sparsedist"]  # stale from step 2
    p = results["provenance"]
    assert len(p["commit"]) == 40 and isinstance(p["dirty"], bool) and "--smoke" in p["command"]
    assert {"torch", "triton", "torchrec", "fbgemm_gpu"} <= set(results["versions"])
    assert results["settings"]["skew"]["lookups"] > 0 and len(results["settings"]["per_table"]) == 4
    assert "| sparsedist | triton |" in markdown and "Top kernels, triton" in markdown


def test_smoke_profile_attributes_time_to_each_backends_tbe(smoke):
    results, _ = smoke
    for backend in ("fbgemm", "triton"):
        profile = results["runs"][f"{backend}/sparsedist"]["profile"]
        groups = profile["groups_ms"]
        assert set(groups) == set(GROUPS)
        assert groups[TBE_FORWARD] > 0 and groups[TBE_BACKWARD] > 0 and groups[DENSE] > 0, (backend, groups)
        assert profile["total_ms"] == pytest.approx(sum(groups.values()))
        assert 0 < len(profile["top"]) <= 15
        times = [k["ms"] for k in profile["top"]]
        assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("kernel, ops, group", [
    ("_pooled_forward_kernel", ["tbe_plugin::lookup", "## forward ##"], TBE_FORWARD),
    ("_chunk_kernel", ["tbe_plugin::fused_update", "autograd::engine::evaluate_function: _FusedLookupBackward"],
     TBE_BACKWARD),
    ("void radix_sort", ["aten::sort", "autograd::engine::evaluate_function: SplitLookupFunction_rowwise_adagrad_Op"],
     TBE_BACKWARD),  # FBGEMM's backward launches generic kernels too: its autograd node decides
    ("split_embedding_codegen_forward_unweighted_kernel",
     ["fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function", "## forward ##"], TBE_FORWARD),
    ("void radix_sort", ["aten::sort", "tbe_plugin::plan_backward", "[lookup]_[model.sparse_arch.ebc]_[table_wise]"],
     TBE_BACKWARD),  # our backward's plan, launched inside TorchRec's lookup range, is backward work
    ("bounds_check_indices_kernel", ["fbgemm::bounds_check_indices", "[lookup]_[model.sparse_arch.ebc]_[table_wise]"],
     TBE_FORWARD),  # TorchRec's range around the lookup holds FBGEMM's bounds check too
    ("void cat_kernel", ["aten::cat", "[output_dist]_[model.sparse_arch.ebc]_[table_wise]"], OTHER),
    ("Memcpy HtoD (Pageable -> Device)", ["aten::copy_", "## forward ##"], OTHER),
    ("void permute_2D_data_kernel", ["fbgemm::permute_2D_sparse_data", "## sparse_data_dist ##"], OTHER),
    ("ncclDevKernel_AllToAll", ["c10d::alltoall_base_"], OTHER),
    ("_crossing_kernel", ["aten::empty"], UNATTRIBUTED_TBE),
    ("sm90_xmma_gemm_f32f32", ["aten::addmm", "## forward ##"], DENSE),
])  # fmt: skip
def test_kernel_group_follows_the_innermost_phase_op(kernel, ops, group):
    assert kernel_group(kernel, ops) == group


def _event(name, parent=None, kernels=(), self_us=0.0):
    return SimpleNamespace(name=name, cpu_parent=parent, kernels=[Kernel(n, 0, us) for n, us in kernels],
                           self_cpu_time_total=self_us, device_type=torch.autograd.DeviceType.CPU)  # fmt: skip


def test_kernel_breakdown_sums_kernels_per_group_and_ranks_them():
    step = _event("## forward ##")
    lookup = _event("tbe_plugin::lookup", step, [("_pooled_forward_kernel", 300.0),
                                                 ("tbe_plugin::lookup", 999.0)], self_us=5.0)  # its GPU range: skipped
    gemm = _event("aten::addmm", step, [("gemm", 500.0), ("gemm", 100.0)], self_us=7.0)
    events = [step, lookup, gemm]
    device = kernel_breakdown(kernel_records(events, device_time=True), steps=2, top=15)
    assert device["groups_ms"][TBE_FORWARD] == pytest.approx(0.15) and device["groups_ms"][DENSE] == pytest.approx(0.3)
    assert device["total_ms"] == pytest.approx(0.45)
    ranked = [(k["kernel"], k["group"]) for k in device["top"]]
    assert ranked == [("gemm", DENSE), ("_pooled_forward_kernel", TBE_FORWARD)]
    assert device["top"][0]["share"] == pytest.approx(600 / 900)
    assert len(kernel_breakdown(kernel_records(events, device_time=True), steps=2, top=1)["top"]) == 1
    cpu = kernel_breakdown(kernel_records(events, device_time=False), steps=1, top=15)  # ops' own CPU time
    assert cpu["groups_ms"][TBE_FORWARD] == pytest.approx(0.005) and cpu["groups_ms"][DENSE] == pytest.approx(0.007)


def test_per_table_tables_validate_naming_the_entry():
    specs = [TableSpec(rows=100, pooling_factor=2, zipf_alpha=1.1), TableSpec(rows=10, pooling_factor=1, zipf_alpha=0)]
    assert rows_per_table(TablesConfig(num_tables=2, dim=4, per_table=specs)) == [100, 10]
    assert rows_per_table(TablesConfig(num_tables=3, rows=7)) == [7, 7, 7]
    bad = [specs[0], TableSpec(rows=10, pooling_factor=1, zipf_alpha=-1.0)]
    with pytest.raises(ConfigError, match=r"tables.per_table\[1\].zipf_alpha"):
        TablesConfig(num_tables=2, per_table=bad)
    with pytest.raises(ConfigError, match="tables.per_table: has 2 entries for tables.num_tables=3"):
        TablesConfig(num_tables=3, per_table=specs)
    with pytest.raises(ConfigError, match="either tables.workload or tables.per_table"):
        TablesConfig(num_tables=2, workload="ctr_dlrm", per_table=specs)
    with pytest.raises(ConfigError, match="tables.workload: 'ctr' is not one of ctr_dlrm"):
        TablesConfig(workload="ctr")


def test_ctr_dlrm_config_group_selects_the_workloads_tables():
    from hydra import compose, initialize_config_dir

    from pipelines.app.config import register, validate

    register()  # the schemas the YAML groups name
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = validate(compose("config", overrides=["tables=ctr_dlrm", "model.dense_arch_layer_sizes=[512,256,128]"]))
    assert cfg.tables.workload == "ctr_dlrm" and cfg.tables.dim == 128
    assert rows_per_table(cfg.tables) == [t.rows for t in ctr_tables_dlrm(num_tables=30, dim=128, seed=0)]


def test_workload_click_log_draws_the_workloads_batches():
    tables = TablesConfig(num_tables=3, dim=8, per_table=[
        TableSpec(rows=300, pooling_factor=3, zipf_alpha=1.2), TableSpec(rows=20, pooling_factor=2, zipf_alpha=0,
                                                                         bag_lengths="fixed"),
        TableSpec(rows=5000, pooling_factor=1, zipf_alpha=1.05)])  # fmt: skip
    data = DataConfig(batch_size=16, seed=3, distinct_batches=2)
    batches = list(WorkloadClickLog(tables, data, 5, torch.device("cpu"), rank=1, num_batches=3))
    assert batches[2] is batches[0] and batches[1] is not batches[0]
    again = WorkloadClickLog(tables, data, 5, torch.device("cpu"), rank=1).batch(0)
    features = batches[0].sparse_features
    assert torch.equal(again.sparse_features.values(), features.values())
    assert torch.equal(again.labels, batches[0].labels) and torch.equal(again.dense_features, batches[0].dense_features)
    assert torch.equal(features["f1"].lengths(), torch.full((16,), 2))  # fixed bags
    for t, rows in enumerate((300, 20, 5000)):
        ids = features[f"f{t}"].values()
        assert ids.min() >= 0 and ids.max() < rows
    other_rank = WorkloadClickLog(tables, data, 5, torch.device("cpu"), rank=0).batch(0)
    assert not torch.equal(other_rank.sparse_features.values(), features.values())
    assert set(batches[0].labels.tolist()) <= {0.0, 1.0} and batches[0].dense_features.shape == (16, 5)


def test_training_app_trains_per_table_tables(tmp_path):
    tables = "[{rows:300,pooling_factor:3,zipf_alpha:1.1},{rows:50,pooling_factor:1,zipf_alpha:0,bag_lengths:fixed}]"
    command = [sys.executable, "-m", "pipelines.app.train", "backend=fbgemm", "steps=6", "eval_batches=2",
               "data.batch_size=32", "logging.progress_bar=false", "tables.num_tables=2", f"tables.per_table={tables}"]
    env = dict(_clean_env(), PYTHONPATH=str(ROOT))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("[rank 0] metrics "))
    metrics = json.loads(line[len("[rank 0] metrics "):])
    assert metrics["steps"] == 6 and 0.0 <= metrics["auc"] <= 1.0 and metrics["log_loss"] > 0


def test_smoke_run_under_a_candidate_launch(tmp_path):
    """``--backward-launch`` and ``triton@NAME``: every Triton TBE module of the sharded model
    takes the candidate (TorchRec keeps its lookups in a plain list, outside ``modules()``; and
    the backend is a config object: both once left the launch silently at the default). Here
    the hot rows apart (``hot16_any``, by ``--backward-launch``), and in the same process, on
    the same batches: with the other ids compacted before the sort (``hot16_split_any``); with
    the lean operands, the L2 hints and the product on tensor cores (``stack16_tf32_any``); a
    bag's repeats merged in place with the marks found beside the operands
    (``merge_marks_any``); the split's plan made by the plan thread (``stack16_thread_any``).
    Under SparseDist every launch's losses agree with FBGEMM's."""
    variants = ["hot16_split_any", "stack16_tf32_any", "merge_marks_any", "stack16_thread_any"]
    backends = ",".join(["fbgemm", "triton"] + [f"triton@{v}" for v in variants])
    command = [sys.executable, "-m", "pipelines.bench.e2e", "--smoke", "--out", str(tmp_path), "--pipelines",
               "sparsedist", "--backward-launch", "hot16_any", "--backends", backends]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "e2e.json").read_text())
    markdown = (tmp_path / "e2e.md").read_text()
    keys = ["triton"] + [f"triton@{v}" for v in variants]
    assert results["settings"]["backends"] == ["fbgemm"] + keys
    assert results["settings"]["backward_launch"] == "hot16_any"
    assert results["runs"]["fbgemm/sparsedist"]["launch_modules"] == 0
    for key in keys:
        assert results["runs"][f"{key}/sparsedist"]["launch_modules"] >= 1, key
        assert results["summary"]["vs_fbgemm"][f"{key}/sparsedist"]["loss_diff_backends"] < 1e-4, key
        assert f"| sparsedist | {key} |" in markdown and f"Top kernels, {key}" in markdown, key
    assert results["summary"]["sparsedist"] is not None  # plain triton's, as before
    assert results["summary"]["sparsedist"] == results["summary"]["vs_fbgemm"]["triton/sparsedist"]


@pytest.mark.parametrize("backends, message", [
    ("fbgemm,triton@no_such_launch", "'no_such_launch' is no candidate"),
    ("fbgemm@stack16", "only triton takes a launch"),
    ("cuda", "the backend is one of fbgemm, triton"),
    ("triton,triton", "given twice"),
    (",", "no backend given"),
])  # fmt: skip
def test_backends_are_checked_before_any_work(backends, message):
    with pytest.raises(ValueError, match=message):
        parse_backends(backends)


def test_backward_launch_is_checked_where_triton_takes_it():
    with pytest.raises(ValueError, match="--backward-launch 'no_such_launch' is no candidate"):
        parse_backends("fbgemm,triton", "no_such_launch")
    assert parse_backends("fbgemm", "no_such_launch") == [("fbgemm", "fbgemm", "")]  # no triton: not used


def test_backends_take_their_launch():
    assert parse_backends("fbgemm,triton,triton@stack16", "lean") == [
        ("fbgemm", "fbgemm", ""), ("triton", "triton", "lean"), ("triton@stack16", "triton", "stack16")]


def test_host_waits_sums_the_device_waits_by_the_ops_that_made_them():
    """The profiler's CUDA runtime calls that wait (synchronizations; copies from 20 us) per
    step, by call and op chain (innermost first); launches and short copies left out; calls
    outside any op (the harness's synchronize) apart."""

    def op(name, parent=None):
        return SimpleNamespace(name=name, cpu_parent=parent, cpu_time_total=0.0)

    dist = op("## sparse_data_dist ##")
    item, copy = op("aten::item", op("aten::tolist", dist)), op("aten::copy_", op("aten::to", dist))
    events = [
        SimpleNamespace(name="cudaStreamSynchronize", cpu_parent=item, cpu_time_total=500.0),
        SimpleNamespace(name="cudaStreamSynchronize", cpu_parent=item, cpu_time_total=100.0),
        SimpleNamespace(name="cudaMemcpyAsync", cpu_parent=copy, cpu_time_total=300.0),
        SimpleNamespace(name="cudaMemcpyAsync", cpu_parent=copy, cpu_time_total=5.0),  # a pinned copy: no wait
        SimpleNamespace(name="cudaLaunchKernel", cpu_parent=item, cpu_time_total=900.0),
        SimpleNamespace(name="cudaDeviceSynchronize", cpu_parent=None, cpu_time_total=100.0),
        item, copy, dist,
    ]
    waits = host_waits(events, steps=2)
    assert waits["ms_per_step"] == pytest.approx(0.45) and waits["outside_ops_ms"] == pytest.approx(0.05)
    assert waits["by_ops"] == [
        {"ops": "cudaStreamSynchronize in aten::item < aten::tolist < ## sparse_data_dist ##",
         "ms": pytest.approx(0.3)},
        {"ops": "cudaMemcpyAsync in aten::copy_ < aten::to < ## sparse_data_dist ##", "ms": pytest.approx(0.15)},
    ]
    deep = op("a", op("b", op("c", op("d", op("e")))))
    waits = host_waits([SimpleNamespace(name="cudaEventSynchronize", cpu_parent=deep, cpu_time_total=10.0)], 1)
    assert waits["by_ops"][0]["ops"] == "cudaEventSynchronize in a < b < ... < d < e"


def test_compiles_records_the_kernels_made_ready_and_restores_the_hook():
    """``benchmarks.compiles``: Triton's post-compile hook (called here as Triton calls it) adds
    the kernel's name and chains to the hook already set, which is back after the block."""
    from triton import knobs

    from tbe_plugin.benchmarks.compiles import compiles

    earlier, before = [], knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kwargs: earlier.append(kwargs["fn"].name)
    try:
        chained = knobs.runtime.jit_post_compile_hook
        with compiles() as seen:
            knobs.runtime.jit_post_compile_hook(key="k", repr="r", fn=SimpleNamespace(name="_pieces_kernel"),
                                                compile={}, is_manual_warmup=False, already_compiled=False)
        assert seen == ["_pieces_kernel"]
        assert earlier == ["_pieces_kernel"] and knobs.runtime.jit_post_compile_hook is chained
    finally:
        knobs.runtime.jit_post_compile_hook = before
