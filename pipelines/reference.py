"""The loop the staleness pipeline must equal: batch j's lookup sees the tables after
j - k updates. Written plainly (no TorchRec pipeline machinery), for tests and benchmarks."""

from typing import Any, Dict, List, Sequence

import torch


def reference_train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Any],
    staleness: int,
    dense_grad_lag: bool = False,
) -> List[Any]:
    """Trains ``model`` (a DMP whose forward returns ``(loss, output)``) on ``batches``:
    before training batch i, the sharded embedding modules look up batches i .. i+k that
    have not been looked up yet; batch i's forward then uses its stored lookup. With
    ``dense_grad_lag`` the dense optimizer applies batch i-1's gradients after batch i's
    backward, and the last batch's at the end."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stash = None
    sharded = _sharded_modules(model)
    lookups: Dict[int, Dict[str, Any]] = {}
    outputs = []
    for i in range(len(batches)):
        for j in range(i, min(i + staleness + 1, len(batches))):
            if j not in lookups:
                lookups[j] = {name: module.forward(_features(batches[j], name)) for name, module in sharded.items()}
        originals = {name: module.forward for name, module in sharded.items()}
        try:
            for name, module in sharded.items():
                module.forward = lambda *args, _result=lookups[i][name], **kwargs: _result
            optimizer.zero_grad()
            loss, output = model(batches[i])
        finally:
            for name, module in sharded.items():
                module.forward = originals[name]
        del lookups[i]
        loss.backward()
        if dense_grad_lag:
            previous, stash = stash, [p.grad for p in params]
            if previous is not None:
                for p, grad in zip(params, previous):
                    p.grad = grad
                optimizer.step()
        else:
            optimizer.step()
        outputs.append(output)
    if stash is not None:
        for p, grad in zip(params, stash):
            p.grad = grad
        optimizer.step()
    return outputs


def _sharded_modules(model: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    from torchrec.distributed.types import ShardedModule

    return {name: m for name, m in model.named_modules() if isinstance(m, ShardedModule)}


def _features(batch: Any, module_name: str) -> Any:
    """The KeyedJaggedTensor a sharded module reads: the batch's ``sparse_features``
    (TorchRec's ``Batch``); models that route features differently need their own."""
    return batch.sparse_features
