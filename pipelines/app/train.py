"""The training app: ``python -m pipelines.app.train [hydra overrides]``, or under torchrun.

Builds TorchRec's DLRM (or DLRM-DCN) over an ``EmbeddingBagCollection``, shards it with the
chosen backend's sharders and our planner, trains it with ``StalenessTrainPipeline`` on
the configured data, evaluates AUC and log loss, and saves a checkpoint when asked. The
config is validated before any process group starts (a bad override fails naming its
key). Rank 0 shows progress and metrics. A job that must not go on holds instead
(``pipelines.holds``: ``HOLD.json``, exit code 3 on a permanent error, 4 while its data is
not ready); checkpoints are committed whole and hold every rank's data position
(``pipelines.checkpoints``, ``pipelines.resumable``).
"""

import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import hydra
import torch

from pipelines.app.config import TrainConfig, register, validate
from pipelines.app.model import build_model, make_sharders
from pipelines.checkpoints import CheckpointStore, newest_complete
from pipelines.holds import (
    Hold, HealthMonitor, JobHeld, StepSignals, clear_hold, error_hold, local_tensors, permanent_error_reason,
)  # fmt: skip
from pipelines.metrics import MetricsLog, binary_quality, phase_times
from tbe_plugin.benchmarks.report import git_state
from tbe_plugin.torchrec.process_group import init_process_group

register()
_IMPORTED_AT = time.time()  # the module's imports done (torch, hydra, the project's): the start-up record's marks
_MAIN: Dict[str, float] = {}  # main()'s wall-clock marks before train() (absent when train() is called directly)


def _say(line: str) -> None:
    """One line to stdout in one write. The ranks share one pipe, and with PYTHONUNBUFFERED set
    ``print`` writes its text and its newline separately: another rank's log line could land
    between them and run into ours (a CI run read ``metrics {...}`` followed by a planner warning)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def data_source(cfg: TrainConfig, rank: int, stream: int = 0) -> Any:
    """This rank's source of training (stream 0) or evaluation (stream 1) batches: Criteo
    files (evaluation reads the held-out ``criteo_eval_paths``) or the planted click log,
    drawn on the device (every batch new; evaluation's stream never repeats training's)."""
    import torch.distributed as dist

    from pipelines.app.data import CriteoTSV, PlantedClickLog

    if cfg.data.source == "sig":
        from pipelines.inputs.batches import sig_batches

        return sig_batches(cfg, rank, dist.get_world_size(), stream)
    if cfg.data.source == "criteo":
        paths = cfg.data.criteo_eval_paths if stream == 1 else cfg.data.criteo_paths
        return CriteoTSV(paths, cfg.data.batch_size, cfg.tables.rows, rank, dist.get_world_size(),
                         ready_suffix=cfg.data.criteo_ready_suffix)  # fmt: skip
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return PlantedClickLog(cfg.tables, cfg.data, cfg.model.dense_in_features, device, rank, -1, stream)


def make_batches(cfg: TrainConfig, rank: int, num_batches: int, stream: int = 0, position: Any = None,
                 source: Any = None):  # fmt: skip
    """``num_batches`` batches of ``source`` (default: ``data_source(cfg, rank, stream)``)
    from ``position`` (a checkpoint's; None: the start), as a ``PositionedBatches``;
    evaluation (stream 1) reads what is ready."""
    from pipelines.resumable import PositionedBatches

    source = source if source is not None else data_source(cfg, rank, stream)
    return PositionedBatches(source.batches_from(position), position, limit=num_batches, stop_when_not_ready=stream == 1)


def _set_learning_rates(cfg: TrainConfig, dmp, dense_optimizer, step: int, sparse_base: List[float]) -> None:
    """Linear warm-up over ``warmup_steps`` for both optimizers (``constant``: nothing); each
    fused group's rate scales its own base (tables with overrides keep theirs)."""
    if cfg.optimizer.lr_schedule != "linear_warmup" or cfg.optimizer.warmup_steps == 0:
        return
    scale = min(1.0, (step + 1) / cfg.optimizer.warmup_steps)
    for group in dense_optimizer.param_groups:
        group["lr"] = cfg.optimizer.dense_lr * scale
    for group, base in zip(dmp.fused_optimizer.param_groups, sparse_base):
        group["lr"] = base * scale
    dmp.fused_optimizer.step()  # applies the fused tables' new learning rate


def evaluate(cfg: TrainConfig, dmp, rank: int, device: torch.device) -> Dict[str, float]:
    """AUC and log loss of the drained model on held-out batches of every rank; on the
    planted click log, the Bayes-optimal predictor's on the same examples too."""
    source = data_source(cfg, rank, stream=1)
    planted = getattr(source, "planted_logits", None)
    logits, labels, optimal = [], [], []
    dmp.eval()
    with torch.no_grad():
        for batch in make_batches(cfg, rank, cfg.eval_batches, stream=1, source=source):
            _, (_, batch_logits, batch_labels) = dmp(batch.to(device))
            logits.append(batch_logits.float().cpu())
            labels.append(batch_labels.float().cpu())
            if planted is not None:
                optimal.append(planted(batch).cpu())
    dmp.train()
    gathered = _gathered((torch.cat(logits), torch.cat(labels), torch.cat(optimal) if optimal else None))
    return binary_quality(torch.cat([g[0] for g in gathered]), torch.cat([g[1] for g in gathered]),
                          torch.cat([g[2] for g in gathered]) if planted is not None else None)  # fmt: skip


_HOST_GROUP: List[Any] = []


def host_group():
    """A gloo group over all ranks for small host-side collectives (the stop flags, the
    checksum): on GPUs they then neither need device tensors nor sync a stream. Made on
    first use, which every rank reaches in the same order."""
    import torch.distributed as dist

    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


def _gathered(value: Any) -> List[Any]:
    import torch.distributed as dist

    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=host_group())
    return out


def _checkpoint_state(dmp, dense_optimizer, step: int) -> Dict[str, Any]:
    return {
        "model": dmp.state_dict(),
        "fused": dmp.fused_optimizer.state_dict(),
        "dense": dense_optimizer.state_dict(),
        "step": torch.tensor(step),
    }


def _restore(store: CheckpointStore, path: str, dmp, dense_optimizer) -> Tuple[int, Any]:
    """Loads the checkpoint at ``path`` into the model and both optimizers; returns its
    step and this rank's data position."""
    from pipelines.app.repartition import load_resharded

    state = _checkpoint_state(dmp, dense_optimizer, 0)
    step, position = store.load(path, {})  # the step, the positions, the world-size check; no tensors
    load_resharded(path, state)  # each rank's fused state lacks other ranks' tables: see there
    dmp.load_state_dict(state["model"])
    dmp.fused_optimizer.load_state_dict(state["fused"])
    dense_optimizer.load_state_dict(state["dense"])
    return step, position


def weights_checksum(dmp) -> float:
    """Sum of every weight (table shards and dense parameters) over all ranks' shards."""
    import torch.distributed as dist

    local = 0.0
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            local += sum(s.tensor.double().sum().item() for s in value.local_shards())
        elif dist.get_rank() == 0 and torch.is_floating_point(value):  # replicated: count once
            local += value.double().sum().item()
    total = torch.tensor(local, dtype=torch.float64)
    dist.all_reduce(total, group=host_group())
    return total.item()


def _inject_faults(step: int, dmp) -> None:
    """Fault injection for the tests, after step n on every rank: PIPELINES_TRAIN_SIGNAL_AT_STEP=n
    sends SIGTERM (a scheduler's notice); PIPELINES_FAULT_NAN_AT_STEP=n fills a dense weight
    with NaN (a diverging run). PIPELINES_FAULT_KILL_IN_SAVE: see pipelines.checkpoints."""
    if step == int(os.environ.get("PIPELINES_TRAIN_SIGNAL_AT_STEP", -1)):
        os.kill(os.getpid(), signal.SIGTERM)
    if step == int(os.environ.get("PIPELINES_FAULT_NAN_AT_STEP", -1)):
        with torch.no_grad():
            next(p for name, p in dmp.named_parameters() if "embedding_bags" not in name).fill_(float("nan"))


def _process_start() -> Optional[float]:
    """This process's start on the wall clock (s), from /proc (Linux, 10 ms ticks); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            since_boot = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _startup_times(train_at: float, built_at: float, restored_at: float, loop_at: float) -> Dict[str, Any]:
    """Where the start-up went, in wall-clock seconds up to ``loop_at`` (just before the
    first step): ``imports_s`` from the process's start to this module imported (the
    interpreter, torch, hydra, the project), ``config_s`` Hydra composing the config,
    ``process_group_s`` validation, the process group, the host group and the barrier,
    ``build_s`` the model built, planned and sharded (and what it imports first), its tables
    initialised, ``restore_s`` a resume's load (0 without), ``data_setup_s`` the pipeline,
    the batches, statistics, metrics log and the rest up to the loop; ``startup_s`` the
    whole, from the process's start (``process_start``). None where a mark is unknown
    (``train()`` called without ``main()``; no /proc)."""
    process_start, main_at, group_at = _process_start(), _MAIN.get("main_at"), _MAIN.get("process_group_at")
    span = lambda a, b: None if a is None or b is None else b - a  # noqa: E731
    return {"process_start": process_start, "imports_s": span(process_start, _IMPORTED_AT),
            "config_s": span(_IMPORTED_AT, main_at), "process_group_s": span(main_at, group_at),
            "build_s": built_at - train_at, "restore_s": restored_at - built_at, "data_setup_s": loop_at - restored_at,
            "startup_s": span(process_start, loop_at)}  # fmt: skip


def train(cfg: TrainConfig) -> Dict[str, Any]:
    """The whole job on an initialized process group; returns the metrics. Stops on a hold
    by raising ``JobHeld`` (``main`` writes it): the ranks agree on a pre-emption, data
    not ready and non-finite values, while a permanent error may reach one rank only.

    Timing in the metrics records (rank 0): every record has its wall-clock ``time``; a
    step record's is when its step ended on the host, or, for the step that paid the
    periodic host sync (reading the losses and health flags, ``sync_ms``), after that
    sync, so that the span between two step records is the loop's whole wall time between
    them (``step_ms`` is ``progress()``'s host time alone: it leaves out the syncs, the
    ranks' agreement at the top of each step and drains). ``startup`` (just before the
    first step) splits the start-up; ``eval``, ``phases``, ``checkpoint``, ``repartition``
    and ``reshard`` give their durations and ``pause_s``, the loop's time they took from
    training; ``final`` the loop's and the end's (final drain and checkpoint, evaluation)."""
    import torch.distributed as dist

    from pipelines.staleness import StalenessTrainPipeline

    train_at = time.time()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    host = host_group()  # every rank makes it here, first
    torch.manual_seed(cfg.data.seed)  # the dense layers' initial weights, the same on every rank and backend
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    store = CheckpointStore(cfg.checkpoint.dir, cfg.checkpoint.keep_last, host) if cfg.checkpoint.dir else None
    first_step, position = 0, None
    resume_from = store.newest(announce=rank == 0) if store and cfg.checkpoint.resume else None
    plan_file, plan = None, None
    if resume_from:  # under the plan it was written under, if the job re-sharded before it
        from pipelines.app.repartition import plan_of_checkpoint

        plan_file, plan = plan_of_checkpoint(cfg.checkpoint.dir, int(os.path.basename(resume_from)[len("step_"):]))
    dmp, dense_optimizer = build_model(cfg, device, world_size, plan=plan)
    built_at = time.time()
    sparse_base = [group["lr"] for group in dmp.fused_optimizer.param_groups]  # as configured, before any resume

    def make_pipeline() -> StalenessTrainPipeline:
        return StalenessTrainPipeline(
            dmp, dense_optimizer, device, staleness=cfg.pipeline.staleness,
            dense_grad_lag=cfg.pipeline.dense_grad_lag, tbe_max_sms=cfg.pipeline.tbe_max_sms,
        )  # fmt: skip

    pipeline = make_pipeline()
    if resume_from:
        first_step, position = _restore(store, resume_from, dmp, dense_optimizer)
        if rank == 0:
            under = f" under the plan of {plan_file}" if plan_file else ""
            _say(f"[rank 0] resumed from {resume_from} at step {first_step}{under}")
    restored_at = time.time()
    batches, collector = make_batches(cfg, rank, cfg.steps - first_step, position=position), None
    if cfg.sharding.statistics_every:  # feature statistics of the batches as the pipeline draws them
        from pipelines.app.data import rows_per_table
        from pipelines.app.repartition import ObservedBatches, make_collector, restore_statistics

        collector = make_collector(rows_per_table(cfg.tables), cfg.tables.dim, device, cfg.sharding.statistics_every)
        if resume_from:
            restore_statistics(collector, resume_from)
        batches = ObservedBatches(batches, collector)
    repartitioner, reshards = None, []
    if cfg.sharding.repartition_every:  # the closed loop: re-plan from the statistics, re-shard when it pays
        from pipelines.app.repartition import carry_batches, make_repartitioner, record_plan

        repartitioner = make_repartitioner(cfg, make_sharders(cfg), world_size, device.type)
    signals = StepSignals(host)
    health = HealthMonitor(device, cfg.health.check_state_every_steps, cfg.health.check_state_rows, cfg.data.seed)
    saved: Dict[str, Any] = {"step": first_step, "path": resume_from}  # nothing trained since: no save
    progress = None
    if rank == 0 and cfg.logging.progress_bar:
        from tqdm import tqdm

        description = f"train {cfg.backend.name} k={cfg.pipeline.staleness}"
        progress = tqdm(initial=first_step, total=cfg.steps, desc=description)
    log = MetricsLog(cfg.logging.metrics_file, cfg.logging.tensorboard_dir if cfg.logging.tensorboard else None,
                     active=rank == 0)  # fmt: skip
    log.record("config", backend=cfg.backend.name, staleness=cfg.pipeline.staleness, world_size=world_size,
               batch_size=cfg.data.batch_size, steps=cfg.steps, device=device.type,
               **(git_state() if rank == 0 and cfg.logging.metrics_file else {}))  # fmt: skip
    losses, start = [], time.perf_counter()
    step, profiler, profiled_ms, profiled_batches = first_step, None, [], 0
    profiler_started: Dict[str, Any] = {}  # the first profiled step, the profiler's start cost
    # losses not yet read (no sync per step): step, loss, step_ms, when the step ended (wall clock)
    pending: List[Tuple[int, torch.Tensor, Optional[float], float]] = []
    bad: Dict[str, Any] = {"loss_step": None, "state": False}  # this rank's non-finite findings, once read

    def trained(loss: torch.Tensor, step_ms: Optional[float]) -> None:
        nonlocal profiled_batches
        profiled_batches += profiler is not None
        pending.append((step, loss.detach().float().reshape(()), step_ms, time.time()))
        health.note_loss(pending[-1][1])
        if len(pending) >= cfg.logging.every_steps:
            read_losses()

    def read_losses() -> None:  # one host sync for every_steps steps, one more for the health flags
        if not pending:
            return
        began = time.perf_counter()
        values = torch.stack([p[1] for p in pending]).tolist()
        state_bad = bad["state"] or health.read()[1]
        sync_ms, synced_at = (time.perf_counter() - began) * 1e3, time.time()
        for i, ((at, _, step_ms, ended), value) in enumerate(zip(pending, values)):
            if bad["loss_step"] is None and not math.isfinite(value):
                bad["loss_step"] = at
            losses.append(value)
            rate = cfg.data.batch_size * world_size / (step_ms / 1e3) if step_ms else None
            paid = {"sync_ms": sync_ms} if i == len(pending) - 1 else {}  # the last step paid the sync: time after it
            log.record("step", at, at=synced_at if paid else ended, loss=value, step_ms=step_ms, examples_per_s=rate,
                       **paid)  # fmt: skip
        pending.clear()
        bad["state"] = state_bad

    def drain() -> None:  # the batches in flight, trained and logged (no step time of their own)
        nonlocal step
        for output in pipeline.drain():
            step += 1
            trained(output[0], None)
        read_losses()

    def hold_if(unhealthy: bool) -> None:
        """An agreed non-finite finding: every rank raises the same hold, named by all ranks' reports."""
        if not unhealthy:
            return
        reports = _gathered((bad["loss_step"], bad["state"]))
        loss_steps = [s for s, _ in reports if s is not None]
        reason = "non_finite_loss" if loss_steps else "non_finite_state"
        hold = Hold("error", reason, min(loss_steps) if loss_steps else step, saved["path"], rank=rank)
        raise JobHeld(hold, agreed=True)

    def checkpoint() -> Optional[str]:
        """Drains, checks the whole state on every rank (a bad one holds instead), saves
        unless nothing trained since the last save; returns the newest checkpoint. Records
        its durations (``path``: what it saved, None when nothing)."""
        began = time.perf_counter()
        drain()
        drained = time.perf_counter()
        if bad["loss_step"] is None and not bad["state"]:
            bad["state"] = not health.all_finite(local_tensors(_checkpoint_state(dmp, dense_optimizer, step)))
        hold_if(signals.agree(unhealthy=bad["loss_step"] is not None or bad["state"]).unhealthy)
        checked, path = time.perf_counter(), None
        if store is not None and saved["step"] != step:
            state = _checkpoint_state(dmp, dense_optimizer, step)
            if collector is not None:  # the statistics survive a resume
                state["statistics"] = collector.state_dict()
            path = store.save(state, step, batches.position_after(step - first_step))
            saved.update(step=step, path=path)
        done = time.perf_counter()
        log.record("checkpoint", step, path=path, drain_s=drained - began, check_s=checked - drained,
                   save_s=done - checked, pause_s=done - drained)  # fmt: skip
        return saved["path"]

    lookahead = cfg.pipeline.staleness + 2  # the most batches one progress() draws
    loop_at = time.time()
    log.record("startup", first_step, at=loop_at, **_startup_times(train_at, built_at, restored_at, loop_at))
    try:
        while step < cfg.steps:
            waiting = batches.waiting_for(lookahead)
            agreed = signals.agree(waiting_for_data=bool(waiting), unhealthy=bad["loss_step"] is not None or bad["state"])
            hold_if(agreed.unhealthy)
            if agreed.preempted:
                path = checkpoint() if store else "(no checkpoint.dir)"
                if rank == 0:
                    _say(f"[rank 0] pre-empted after step {step}: checkpoint {path}; exiting")
                raise JobHeld(Hold("preempted", "preemption_signal", step, saved["path"], rank=rank), agreed=True)
            if agreed.waiting_for_data:
                checkpoint()  # what was trained since the last checkpoint is kept
                waits = sorted({path for ranks_waits in _gathered(waiting) for path in ranks_waits})
                if rank == 0:
                    _say(f"[rank 0] data not ready after step {step}: waiting for {', '.join(waits)}; "
                         f"checkpoint {saved['path']}; exiting")  # fmt: skip
                raise JobHeld(Hold("data", "data_not_ready", step, saved["path"], waiting_for=waits, rank=rank), True)
            _set_learning_rates(cfg, dmp, dense_optimizer, step, sparse_base)
            if cfg.logging.profile_steps and step - first_step == cfg.logging.profile_after and rank == 0:
                t0 = time.perf_counter()
                profiler = _start_profiler(device)  # rank 0 only: it alone records the phases
                profiler_started.update(step=step + 1, start_s=time.perf_counter() - t0)
            began = time.perf_counter()
            try:
                loss, _, _ = pipeline.progress(batches)
            except StopIteration:
                break
            step += 1
            step_ms = (time.perf_counter() - began) * 1e3  # host time: the queue bounds how far it runs ahead
            trained(loss, step_ms)
            health.sample_state(step, lambda: local_tensors(_checkpoint_state(dmp, dense_optimizer, step)))
            _inject_faults(step, dmp)
            if profiler is not None:
                profiled_ms.append(step_ms)
                if len(profiled_ms) == cfg.logging.profile_steps:
                    t0 = time.perf_counter()
                    profiler.stop()
                    median_ms = sorted(profiled_ms)[len(profiled_ms) // 2]
                    phases = phase_times(profiler.events(), profiled_batches, median_ms, device.type == "cuda")
                    stop_s, start_s = time.perf_counter() - t0, profiler_started["start_s"]
                    # the profiled steps' own slowdown is in their step times (profiled_steps_ms), not in pause_s
                    log.record("phases", step, **phases, profiled_steps=[profiler_started["step"], step],
                               profiled_steps_ms=sum(profiled_ms), profiler_start_s=start_s, profiler_stop_s=stop_s,
                               pause_s=start_s + stop_s)  # fmt: skip
                    profiler = None
            if progress is not None:
                progress.update(1)
                if not pending and losses:  # the losses were just read
                    rate = (step - first_step) * cfg.data.batch_size * world_size / (time.perf_counter() - start)
                    progress.set_postfix(loss=f"{losses[-1]:.4f}", examples_per_s=f"{rate:.0f}")
            if store and cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                checkpoint()
            if repartitioner is not None and repartitioner.due(step) and step < cfg.steps:
                t0 = time.perf_counter()
                decision = repartitioner.check(dmp, batches.collector, step)
                check_s = time.perf_counter() - t0
                log.record("repartition", step, **decision.record(), check_s=check_s, pause_s=check_s)
                if rank == 0:
                    _say(f"[rank 0] {decision.line()}")
                if decision.reshard:
                    path = checkpoint()  # drains; written under the old plan
                    t0 = time.perf_counter()
                    old_pipeline = pipeline
                    old_pipeline.detach()
                    dmp, dense_optimizer, sparse_base = _resharded(cfg, decision.plan, store, path, device, world_size)
                    pipeline = make_pipeline()
                    carry_batches(old_pipeline, pipeline)
                    reshards.append(step)
                    if rank == 0:
                        record_plan(cfg.checkpoint.dir, step, decision.plan)
                    reshard_s = time.perf_counter() - t0
                    log.record("reshard", step, reshard_s=reshard_s, pause_s=reshard_s)
            if cfg.eval_every_steps and cfg.eval_batches and step % cfg.eval_every_steps == 0 and step < cfg.steps:
                drain()
                t0 = time.perf_counter()
                pipeline.detach()  # evaluation runs the model's own forwards; progress() re-attaches
                quality = evaluate(cfg, dmp, rank, device)
                eval_s = time.perf_counter() - t0
                log.record("eval", step, **quality, eval_s=eval_s, pause_s=eval_s)
        loop_end_at = time.time()
        checkpoint_path = checkpoint()  # drains; no metrics, no checkpoint from a non-finite state
    except Exception as error:
        reason = None if isinstance(error, JobHeld) else permanent_error_reason(error)
        if reason is None:
            raise
        raise JobHeld(error_hold(error, reason, step, saved["path"], rank), agreed=False) from error
    finally:
        if progress is not None:
            progress.close()
    pipeline.detach()  # the model's own forwards, for evaluation
    metrics = {"steps": first_step + len(losses), "first_loss": losses[0] if losses else None,
               "last_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
               "weights_checksum": weights_checksum(dmp)}  # fmt: skip
    if cfg.eval_batches:
        t0 = time.perf_counter()
        quality = evaluate(cfg, dmp, rank, device)
        metrics.update(quality)
        log.record("eval", first_step + len(losses), **quality, eval_s=time.perf_counter() - t0)
    if store:
        metrics["checkpoint"] = checkpoint_path
    if repartitioner is not None:
        metrics["reshard_steps"] = reshards
    if cfg.sharding.statistics_every:
        _log_imbalance(cfg, dmp, batches.collector, world_size, device, log, first_step + len(losses), metrics)
    # not in metrics (printed, compared between runs): the loop's wall time (its start to its
    # end, before the final drain) and the end's (the final drain and checkpoint, checksum, evaluation)
    final_at = time.time()
    log.record("final", first_step + len(losses), at=final_at, **metrics, loop_s=loop_end_at - loop_at,
               end_s=final_at - loop_end_at)  # fmt: skip
    log.close()
    if rank == 0:
        _say(f"[rank 0] metrics {json.dumps(metrics)}")
    return metrics


def _resharded(cfg: TrainConfig, plan: Any, store: CheckpointStore, path: str, device: torch.device,
               world_size: int) -> Tuple[Any, Any, List[float]]:
    """The model and both optimizers built under ``plan`` and loaded from the checkpoint at
    ``path`` (DCP re-shards what was written under the old plan), and the sparse groups'
    configured learning rates."""
    # Building draws the dense layers' initial weights, which the load replaces: the run's
    # random stream must go on as if nothing was built.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        dmp, dense_optimizer = build_model(cfg, device, world_size, plan=plan)
    sparse_base = [group["lr"] for group in dmp.fused_optimizer.param_groups]
    _restore(store, path, dmp, dense_optimizer)
    return dmp, dense_optimizer, sparse_base


def _log_imbalance(cfg: TrainConfig, dmp, collector, world_size: int, device: torch.device, log: Any, step: int,
                   metrics: Dict[str, Any]) -> None:
    """The plan's imbalance under the statistics of the batches trained on: a log record,
    a line from rank 0, the ratio in ``metrics``, the statistics JSON if asked."""
    import torch.distributed as dist

    from pipelines.app.repartition import report_imbalance

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    statistics, report = report_imbalance(dmp, collector, world_size, local, cfg.data.batch_size, device.type)
    name = cfg.sharding.preset or "plan"
    log.record("imbalance", step, max_over_mean=report.max_over_mean, hottest_rank=report.hottest_rank,
               predicted_step_ms=report.predicted_step_ms, hottest_tables=report.hottest_tables())  # fmt: skip
    metrics["imbalance_max_over_mean"] = report.max_over_mean
    if dist.get_rank() == 0:
        _say(f"[rank 0] {report.line(name)}")
        if cfg.sharding.statistics_out:
            from pipelines.app.repartition import plan_file_beside, save_plan

            statistics.save(cfg.sharding.statistics_out)
            save_plan(dmp.plan, plan_file_beside(cfg.sharding.statistics_out), step=step)


def _start_profiler(device: torch.device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = profile(activities=activities)
    profiler.start()
    return profiler


def _run_dir() -> str:
    """Hydra's run directory (this app's is the working directory): where HOLD.json goes."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else os.getcwd()


def _write_hold(hold: Hold, run_dir: str) -> int:
    path = hold.write(run_dir)
    where = f"; last good checkpoint {hold.last_good_checkpoint}" if hold.last_good_checkpoint else ""
    _say(f"[rank {hold.rank}] hold ({hold.kind}): {hold.reason} at step {hold.step}{where}; {path}")
    return hold.exit_code


@hydra.main(config_path="../../conf", config_name="config", version_base="1.3")
def main(raw_cfg: Any) -> None:
    """Validates, trains, closes; exits with the hold's code when the job holds (3: a
    permanent error, 4: data not ready; 0 after a pre-emption)."""
    import torch.distributed as dist

    _MAIN["main_at"] = time.time()  # Hydra has composed the config
    cfg = validate(raw_cfg)  # before any process group: a bad value fails here, named
    logging.getLogger("torchrec.distributed.planner").setLevel(logging.WARNING)  # its plan tables
    rank = init_process_group()[0]
    run_dir, code = _run_dir(), 0
    if rank == 0:
        clear_hold(run_dir)  # an earlier launch's: this one is running
    dist.barrier(group=host_group())
    _MAIN["process_group_at"] = time.time()
    try:
        train(cfg)
    except JobHeld as held:
        code = _write_hold(held.hold, run_dir) if not held.agreed or rank == 0 else held.hold.exit_code
    except Exception as error:  # before the first step: building, planning, resuming
        reason = permanent_error_reason(error)
        if reason is None:
            raise
        code = _write_hold(error_hold(error, reason, None, newest_complete(cfg.checkpoint.dir), rank), run_dir)
    finally:
        dist.destroy_process_group()
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
