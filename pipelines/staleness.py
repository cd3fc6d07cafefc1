"""A TorchRec training pipeline whose embedding lookups run ``staleness`` batches ahead.

``StalenessTrainPipeline(model, optimizer, device, staleness=k).progress(dataloader_iter)``
trains one batch per call and returns the model's output for it, on TorchRec's
``TrainPipeline`` interface, for any ``DistributedModelParallel`` model whose forward
returns ``(loss, output)``:

- ``k = 0``: a plain loop (input all-to-all, lookup, output all-to-all, dense forward,
  backward with the fused table update, dense optimizer step), batch after batch: the
  same results, bit for bit.
- ``k >= 1``: the lookups (and output all-to-alls) of batches i+1 .. i+k are issued before
  batch i trains, so batch j's lookup sees the tables as they were after j - k updates
  (the semantics of TorchRec's ``TrainPipelineSemiSync`` for k = 1, generalized). Each
  batch's fused update still runs inside its own ``loss.backward()``.

The batches drawn but not yet trained are in flight: ``drain()`` trains them (call it
before a checkpoint or an evaluation); the end of the data drains them too, then
``progress`` raises ``StopIteration`` on every call until given a new iterator. A
dataloader that raises leaves nothing half done: the next batch is drawn before anything
is issued for it.

``dense_grad_lag=True`` steps the dense optimizer one batch behind (TorchRec's
``stash_gradients``), applying the last gradients when the pipeline empties.

This version runs every step on the current stream: the staleness semantics are complete,
the side-stream overlap of lookups with dense compute (and ``tbe_max_sms``, which raises
when asked) are not yet. See DESIGN.md.
"""

from collections import deque
from typing import Any, Deque, Iterator, List, Optional, Tuple

import torch

from pipelines._compat import (
    EmbeddingPipelinedForward,
    EmbeddingTrainPipelineContext,
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


class _InFlightForward(EmbeddingPipelinedForward):
    """A sharded module's forward inside the pipeline: returns the output all-to-all its
    batch's context holds (issued when the batch was drawn)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._context.embedding_a2a_requests.pop(self._name)


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
        if tbe_max_sms is not None:
            raise NotImplementedError("tbe_max_sms is not implemented yet (lookups run on the current stream)")
        self._model = model
        self._optimizer = optimizer
        self._device = torch.device(device)
        self._staleness = staleness
        self._dense_grad_lag = bool(dense_grad_lag)
        self._stash: Optional[List[Optional[torch.Tensor]]] = None
        self._in_flight: Deque[Tuple[Any, Any]] = deque()
        self._modules: Optional[List[torch.nn.Module]] = None
        self._original_forwards: List[Any] = []
        self._original_dist_forwards: List[Any] = []
        self._iterator: Optional[Iterator[Any]] = None
        self._exhausted = False
        self._drawn = 0

    @property
    def staleness(self) -> int:
        return self._staleness

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Trains the oldest batch in flight, after drawing batches (and issuing their
        lookups) until ``staleness + 1`` are in flight; returns its output."""
        self._check_training()
        if dataloader_iter is not self._iterator:
            self._iterator, self._exhausted = dataloader_iter, False
        while len(self._in_flight) <= self._staleness and not self._exhausted:
            try:
                batch = next(dataloader_iter)
            except StopIteration:
                self._exhausted = True
                break
            self._issue(batch)
        if not self._in_flight:
            self._apply_stash()
            raise StopIteration
        return self._train_oldest()

    def drain(self) -> List[Any]:
        """Trains every batch in flight (before a checkpoint or an evaluation, so that no
        lookup computed on older tables is left); returns their outputs in order."""
        outputs = []
        while self._in_flight:
            outputs.append(self._train_oldest())
        self._apply_stash()
        return outputs

    def detach(self) -> torch.nn.Module:
        """Drains, then gives the model its own forwards back (for evaluation or another
        pipeline); the next ``progress`` rewrites it again."""
        self.drain()
        if self._modules is not None:
            _pipeline_detach_model(
                model=self._model, pipelined_modules=self._modules, original_forwards=self._original_forwards,
                original_kjt_dist_forwards=self._original_dist_forwards, pipelined_postprocs=[],
            )  # fmt: skip
            self._modules = None
        return self._model

    def _issue(self, batch: Any) -> None:
        """Moves ``batch`` to the device, starts its input all-to-all, looks it up and
        starts its output all-to-all, keeping the result in the batch's context."""
        if hasattr(batch, "to"):
            batch = batch.to(self._device, non_blocking=True)
        context = EmbeddingTrainPipelineContext(index=self._drawn, version=1)
        self._drawn += 1
        first = self._modules is None
        if first:
            self._modules = self._rewrite(batch, context)
        _start_data_dist(self._modules, batch, context)
        if first:  # the modules' input dists exist now: fuse their splits all-to-alls
            self._original_dist_forwards = _override_input_dist_forwards(self._modules)
        for names, awaitable in context.fused_splits_awaitables:
            for name, request in zip(names, awaitable.wait()):
                context.input_dist_tensors_requests[name] = request
        for module in self._modules:
            name = module.forward.name
            features = context.input_dist_tensors_requests.pop(name).wait()
            module_context = context.module_contexts.pop(name)
            context.embedding_a2a_requests[name] = module.compute_and_output_dist(module_context, features)
        self._in_flight.append((batch, context))

    def _check_training(self) -> None:
        if not self._model.training:
            raise RuntimeError(
                "the model is in eval mode: call drain() or detach() before evaluating (batches in "
                "flight were looked up for training), then model.train() to go on training"
            )

    def _train_oldest(self) -> Any:
        self._check_training()
        batch, context = self._in_flight.popleft()
        for module in self._modules:
            module.forward.set_context(context)
        self._optimizer.zero_grad()
        loss, output = self._model(batch)
        loss.backward()
        if self._dense_grad_lag:
            self._step_one_behind()
        else:
            self._optimizer.step()
        return output

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
