"""A TorchRec training pipeline whose embedding lookups run ``staleness`` batches ahead.

``StalenessTrainPipeline(model, optimizer, device, staleness=k).progress(dataloader_iter)``
trains one batch per call and returns the model's output for it, on TorchRec's
``TrainPipeline`` interface, for any ``DistributedModelParallel`` model whose forward
returns ``(loss, output)``:

- ``k = 0``: a plain loop (input all-to-all, lookup, output all-to-all, dense forward,
  backward with the fused table update, dense optimizer step), batch after batch: the
  same results, bit for bit, with the next batch's copy and input all-to-all overlapping
  the current step (as TorchRec's ``TrainPipelineSparseDist``).
- ``k >= 1``: the lookups (and output all-to-alls) of batches i+1 .. i+k are issued before
  batch i trains, so batch j's lookup sees the tables as they were after j - k updates
  (the semantics of TorchRec's ``TrainPipelineSemiSync`` for k = 1, generalized).

Streams (CUDA; on CPU everything runs in program order): the data stream copies a batch
to the device and starts its input all-to-all one step before its lookups; the sparse
stream runs every lookup and output all-to-all, and every fused table update, in program
order: a lookup never races an update. The dense forward and backward run on the current
stream, which waits for its batch's lookups by an event only, so with k >= 1 they overlap
the fused update of the previous batch and the lookups of the next ones. Tensors crossing
streams are ``record_stream``-ed. The input all-to-all needs a host sync on its splits,
which waits for every collective queued before them and for the data stream's queue: the
splits are exchanged a step before they are needed (ahead of that step's lookups and
backward), and a batch's input all-to-all is finished before the next batch's copy is
queued, so the sync finds both done and the host runs ahead.

The batches drawn but not yet trained are in flight: ``drain()`` trains them (call it
before a checkpoint or an evaluation); the end of the data drains them too, then
``progress`` raises ``StopIteration`` on every call until given a new iterator. One batch
more than the lookups need is drawn, copied and its input all-to-all started; it is not
looked up until its turn, so ``drain()`` keeps it for the next ``progress`` and
``detach()`` gives it back to be drawn again. A dataloader that raises leaves nothing half
done: drawing precedes all work on a batch; the error is raised once the step that was
under way has trained (at the next call), so no output is lost.

The dense backward and the lookups' backward (the fused update) are two backward calls:
the model's output for a batch reaches its lookups through detached copies of their values
(TorchRec's SemiSync does the same), whose gradients then drive the lookups' backward on
the sparse stream. One ``loss.backward()`` through both would make the current stream wait
for the update at its end, serializing it with the next dense step. So dense parameters
must not get gradients through the lookups (feature processors' weights would not).

``dense_grad_lag=True`` steps the dense optimizer one batch behind (TorchRec's
``stash_gradients``), applying the last gradients when the pipeline empties.

``tbe_max_sms=n`` (CUDA) puts the sparse stream in a green context of n SMs, so that the
lookups and updates co-run with the dense step's GEMMs instead of taking every SM. See
DESIGN.md.
"""

import contextlib
import ctypes
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional

import torch

from pipelines._compat import (
    EmbeddingPipelinedForward,
    EmbeddingTrainPipelineContext,
    LazyNoWait,
    TrainPipeline,
    _override_input_dist_forwards,
    _pipeline_detach_model,
    _rewrite_model,
    _start_data_dist,
)

# Table kernels whose lookups may run ahead of their updates: fused ones, whose updates
# are in place and ordered by autograd. A dense (data-parallel) table's optimizer would
# bump the version of a weight an in-flight lookup saved; caching kernels keep per-batch
# cache state.
STALE_SAFE_KERNELS = ("fused", "fused_triton")


def _on(stream: Optional[torch.cuda.Stream]) -> Any:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _record(value: Any, stream: Optional[torch.cuda.Stream]) -> None:
    """``record_stream`` on a tensor, a TorchRec Pipelineable (Batch, KJT, KeyedTensor,
    module context) or a dict/list of them, so the allocator keeps their memory for
    ``stream``'s pending work."""
    if stream is None or value is None:
        return
    if isinstance(value, dict):
        for item in value.values():
            _record(item, stream)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _record(item, stream)
    elif isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif hasattr(value, "record_stream"):
        value.record_stream(stream)


def _capped_stream(device: torch.device, max_sms: int) -> Any:
    """A CUDA green context of ``max_sms`` SMs and a stream in it: the kernels on that stream
    (lookups, output all-to-all glue, fused updates, of either backend) run on those SMs
    only, leaving the rest to the dense step. The driver rounds the count to its SM
    granularity; NCCL's kernels run on NCCL's streams, outside the cap."""
    if device.type != "cuda":
        raise ValueError(f"tbe_max_sms={max_sms}: SM caps are CUDA green contexts; this device is {device}")
    from torch.cuda import green_contexts

    if not getattr(green_contexts, "SUPPORTED", False):
        raise RuntimeError(f"tbe_max_sms={max_sms}: this PyTorch ({torch.__version__}) has no CUDA green contexts")
    available = torch.cuda.get_device_properties(device).multi_processor_count
    if max_sms > available:
        raise ValueError(f"tbe_max_sms={max_sms}: the device has {available} SMs")
    index = torch.cuda.current_device() if device.index is None else device.index
    key = (index, max_sms)
    if key not in _GREEN_CONTEXTS:
        context = green_contexts.GreenContext.create(num_sms=max_sms, device_id=index)
        if hasattr(context, "Stream"):
            stream = context.Stream()
        else:
            context.set_context()  # older PyTorch: a stream created while the green context is current
            try:
                stream = torch.cuda.Stream(device)
            finally:
                context.pop_context()
        _GREEN_CONTEXTS[key] = (context, stream)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(context))  # never destroyed, not even at exit
    return _GREEN_CONTEXTS[key]


# Green contexts live as long as the process: the caching allocator frees blocks that were
# used on their streams (record_stream) whenever their last tensor goes, possibly after the
# pipeline is gone, and an event on a destroyed context's stream aborts the process ("context
# is destroyed", seen on the H200), at interpreter exit too. Keyed by (device index, SMs):
# pipelines with the same cap share one.
_GREEN_CONTEXTS: Dict[Any, Any] = {}


def _detach_lookups(results: Dict[str, Any]) -> Any:
    """Swaps the lookup results' values (KeyedTensor for an EBC, JaggedTensors for an EC)
    for detached leaves that collect the dense backward's gradient; returns the original
    values and the leaves, for ``_sparse_backward``."""
    lookups, leaves = [], []
    for result in results.values():
        holders = result.values() if isinstance(result, dict) else [result]
        for holder in holders:
            values = holder._values
            if not values.requires_grad:
                continue
            leaf = values.detach().requires_grad_()
            holder._values = leaf
            lookups.append(values)
            leaves.append(leaf)
    return lookups, leaves


class _Staged:
    """A drawn batch: copied to the device, then its input all-to-all (``features``, with
    the data stream's event ``ready``), then its lookups (the sparse stream's event
    ``looked_up``)."""

    def __init__(self, raw: Any, batch: Any, context: Any) -> None:
        self.raw, self.batch, self.context = raw, batch, context
        self.features: Dict[str, Any] = {}
        self.ready: Any = None
        self.looked_up: Any = None


class _InFlightForward(EmbeddingPipelinedForward):
    """A sharded module's forward inside the pipeline: returns the lookup (output
    all-to-all waited) its batch's context holds, issued when the batch was looked up."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return LazyNoWait(self._context.embedding_a2a_requests.pop(self._name))


class StalenessTrainPipeline(TrainPipeline):
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        staleness: int = 0,
        dense_grad_lag: bool = False,
        tbe_max_sms: Optional[int] = None,
    ) -> None:
        if not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"staleness must be an int >= 0, got {staleness!r}")
        if tbe_max_sms is not None and (not isinstance(tbe_max_sms, int) or tbe_max_sms < 1):
            raise ValueError(f"tbe_max_sms must be an int >= 1 or None, got {tbe_max_sms!r}")
        self._model = model
        self._optimizer = optimizer
        self._device = torch.device(device)
        self._staleness = staleness
        self._dense_grad_lag = bool(dense_grad_lag)
        self._stash: Optional[List[Optional[torch.Tensor]]] = None
        self._in_flight: Deque[_Staged] = deque()
        self._started: Deque[_Staged] = deque()  # drawn; copy and input all-to-all started
        self._pending: Deque[Any] = deque()  # batches given back by detach(), drawn first
        self._loader_error: Optional[BaseException] = None
        self._modules: Optional[List[torch.nn.Module]] = None
        self._original_forwards: List[Any] = []
        self._original_dist_forwards: List[Any] = []
        self._iterator: Optional[Iterator[Any]] = None
        self._exhausted = False
        self._drawn = 0
        cuda = self._device.type == "cuda"
        self._data_stream = torch.cuda.Stream(self._device) if cuda else None
        self._green_context: Any = None
        if tbe_max_sms is not None:
            self._green_context, self._sparse_stream = _capped_stream(self._device, tbe_max_sms)
        else:
            self._sparse_stream = torch.cuda.Stream(self._device) if cuda else None

    @property
    def staleness(self) -> int:
        return self._staleness

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Trains the oldest batch in flight, after looking up batches until ``staleness +
        1`` are in flight. Each lookup first finishes its batch's input all-to-all (started
        a step earlier), then starts the next batch's copy and input all-to-all, whose
        splits exchange so goes ahead of this step's collectives. Returns the trained
        batch's output."""
        self._check_training()
        self._raise_loader_error()
        if dataloader_iter is not self._iterator:
            self._iterator, self._exhausted = dataloader_iter, False
        while len(self._in_flight) <= self._staleness:
            if not self._started and not self._start_next(dataloader_iter):
                break
            staged = self._started.popleft()
            self._finish_input_dist(staged)  # first: its host sync finds the data stream idle
            if not self._started:
                self._start_next(dataloader_iter)
            self._look_up(staged)
        if not self._in_flight:
            self._raise_loader_error()
            self.drain()  # nothing in flight: the last stash applied, the tables' readers ordered
            raise StopIteration
        return self._train_oldest()

    def _start_next(self, dataloader_iter: Iterator[Any]) -> bool:
        """Draws the next batch and starts it; False at the end of the data, or when the
        loader raised (the error is raised once the batches in flight have trained: at
        this call if none is, else at the next)."""
        if self._loader_error is not None:
            return False
        try:
            raw = self._draw(dataloader_iter)
        except Exception as error:
            self._loader_error = error
            return False
        if raw is None:
            return False
        self._started.append(self._start(raw))
        return True

    def drain(self) -> List[Any]:
        """Trains every batch in flight (before a checkpoint or an evaluation, so that no
        lookup computed on older tables is left); returns their outputs in order. A batch
        whose input all-to-all was started but not looked up stays for the next ``progress``."""
        outputs = []
        while self._in_flight:
            outputs.append(self._train_oldest())
        self._apply_stash()
        # Readers of the tables on the current stream (a checkpoint, an evaluation, the code
        # after the end of the data) see every update issued; an H200 run at world size 2
        # read the last update half done when the end of the data skipped this.
        if self._sparse_stream is not None:
            torch.cuda.current_stream(self._device).wait_stream(self._sparse_stream)
        return outputs

    def detach(self) -> torch.nn.Module:
        """Drains, then gives the model its own forwards back (for evaluation or another
        pipeline); the next ``progress`` rewrites it again, drawing first the batches that
        were drawn but not looked up (their started input all-to-alls are finished, on every
        rank alike, and dropped)."""
        self.drain()
        while self._started:
            staged = self._started.pop()
            self._finish_input_dist(staged)
            self._pending.appendleft(staged.raw)
        if self._modules is not None:
            _pipeline_detach_model(
                model=self._model, pipelined_modules=self._modules, original_forwards=self._original_forwards,
                original_kjt_dist_forwards=self._original_dist_forwards, pipelined_postprocs=[],
            )  # fmt: skip
            self._modules = None
        return self._model

    def _raise_loader_error(self) -> None:
        if self._loader_error is not None:
            error, self._loader_error = self._loader_error, None
            raise error

    def _draw(self, dataloader_iter: Iterator[Any]) -> Any:
        """The next batch (given-back ones first), or None at the end of the data."""
        if self._pending:
            return self._pending.popleft()
        if self._exhausted:
            return None
        try:
            return next(dataloader_iter)
        except StopIteration:
            self._exhausted = True
            return None

    def _start(self, raw: Any) -> _Staged:
        """On the data stream, with no host sync: copies ``raw`` to the device and starts
        its input all-to-all (issues the splits exchange). ``_finish_input_dist`` waits for
        it a step later, when the collectives queued before it are long done."""
        context = EmbeddingTrainPipelineContext(index=self._drawn, version=1)
        self._drawn += 1
        with _on(self._data_stream):
            batch = raw.to(self._device, non_blocking=True) if hasattr(raw, "to") else raw
            first = self._modules is None
            if first:
                self._modules = self._rewrite(batch, context)
            _start_data_dist(self._modules, batch, context)
            if first:  # the modules' input dists exist now: fuse their splits all-to-alls
                self._original_dist_forwards = _override_input_dist_forwards(self._modules)
        return _Staged(raw, batch, context)

    def _finish_input_dist(self, staged: _Staged) -> None:
        """On the data stream: waits for the splits (a host sync), exchanges the tensors,
        and records ``ready`` for the lookups."""
        context = staged.context
        with _on(self._data_stream):
            for names, awaitable in context.fused_splits_awaitables:
                for name, request in zip(names, awaitable.wait()):
                    context.input_dist_tensors_requests[name] = request
            staged.features = {name: r.wait() for name, r in context.input_dist_tensors_requests.items()}
            context.input_dist_tensors_requests.clear()
            if self._data_stream is not None:
                staged.ready = torch.cuda.Event()
                staged.ready.record(self._data_stream)

    def _look_up(self, staged: _Staged) -> None:
        """On the sparse stream: the lookups and output all-to-alls of ``staged``."""
        stream = self._sparse_stream
        if stream is not None:
            if not self._in_flight:  # host-side writes (checkpoint load, eval) before new lookups
                stream.wait_stream(torch.cuda.current_stream(self._device))
            stream.wait_event(staged.ready)
        context = staged.context
        with _on(stream), torch.enable_grad():
            for module in self._modules:
                name = module.forward.name
                features = staged.features.pop(name)
                module_context = context.module_contexts.pop(name)
                _record(features, stream)
                _record(module_context, stream)
                context.embedding_a2a_requests[name] = module.compute_and_output_dist(module_context, features).wait()
            if stream is not None:
                staged.looked_up = torch.cuda.Event()
                staged.looked_up.record(stream)
        self._in_flight.append(staged)

    def _check_training(self) -> None:
        if not self._model.training:
            raise RuntimeError(
                "the model is in eval mode: call drain() or detach() before evaluating (batches in "
                "flight were looked up for training), then model.train() to go on training"
            )

    def _train_oldest(self) -> Any:
        self._check_training()
        staged = self._in_flight.popleft()
        if staged.looked_up is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(staged.looked_up)
            _record(staged.batch, current)
            _record(staged.context.embedding_a2a_requests, current)
        for module in self._modules:
            module.forward.set_context(staged.context)
        lookups, leaves = _detach_lookups(staged.context.embedding_a2a_requests)
        self._optimizer.zero_grad()
        loss, output = self._model(staged.batch)
        loss.backward()
        self._sparse_backward(lookups, leaves)
        if self._dense_grad_lag:
            self._step_one_behind()
        else:
            self._optimizer.step()
        return output

    def _sparse_backward(self, lookups: List[torch.Tensor], leaves: List[torch.Tensor]) -> None:
        """The lookups' backward (output all-to-all backward, fused table update) from the
        gradients the dense backward left on their detached copies, issued on the sparse
        stream. A separate backward call: ``loss.backward()`` makes the calling stream wait
        for every stream its backward used, which would hold the next dense step until the
        table update is done; this one only makes the sparse stream wait for the dense
        backward."""
        pairs = [(lookup, leaf.grad) for lookup, leaf in zip(lookups, leaves) if leaf.grad is not None]
        if not pairs:
            return
        stream = self._sparse_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self._device))
            for _, grad in pairs:
                grad.record_stream(stream)
        with _on(stream):
            torch.autograd.backward([lookup for lookup, _ in pairs], [grad for _, grad in pairs])

    def _dense_parameters(self) -> List[torch.nn.Parameter]:
        return [p for group in self._optimizer.param_groups for p in group["params"]]

    def _step_one_behind(self) -> None:
        """The dense optimizer steps with the previous batch's gradients and keeps this
        batch's for the next step (TorchRec's ``stash_gradients``)."""
        parameters = self._dense_parameters()
        previous, self._stash = self._stash, [p.grad for p in parameters]
        if previous is None:
            return
        for p, grad in zip(parameters, previous):
            p.grad = grad
        self._optimizer.step()

    def _apply_stash(self) -> None:
        """The last stashed gradients, applied when the pipeline empties, so that none is
        lost (TorchRec's SemiSync drops them at the end of the data)."""
        if self._stash is None:
            return
        for p, grad in zip(self._dense_parameters(), self._stash):
            p.grad = grad
        self._stash = None
        self._optimizer.step()

    def _rewrite(self, batch: Any, context: Any) -> List[torch.nn.Module]:
        """Swaps the sharded modules' forwards for ones that read the pipeline's results
        (TorchRec's rewrite), after checking that every table may run ahead."""
        self._check_kernels()
        modules, _, self._original_forwards, _, not_pipelined = _rewrite_model(
            model=self._model, context=context, dist_stream=None, batch=batch, pipelined_forward=_InFlightForward
        )
        if not_pipelined and self._staleness > 0:
            raise ValueError(
                f"staleness={self._staleness}: sharded modules {sorted(not_pipelined)} take inputs the "
                "pipeline cannot trace to the batch, so their lookups cannot run ahead"
            )
        return modules

    def _check_kernels(self) -> None:
        """With k >= 1, every table must use a kernel whose lookups may run ahead."""
        if self._staleness == 0:
            return
        plan = getattr(self._model, "plan", None)
        if plan is None:
            raise ValueError("the staleness pipeline needs a DistributedModelParallel model")
        for module_path, module_plan in plan.plan.items():
            for table, sharding in module_plan.items():
                if sharding.compute_kernel not in STALE_SAFE_KERNELS:
                    raise ValueError(
                        f"staleness={self._staleness}: table {table!r} ({module_path or 'model'}) uses "
                        f"kernel {sharding.compute_kernel!r}; lookups may run ahead only for "
                        f"{', '.join(STALE_SAFE_KERNELS)} tables"
                    )
