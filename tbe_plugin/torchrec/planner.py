"""A TorchRec planner that can price our kernel.

TorchRec's perf estimator knows FUSED_TRITON's bandwidth on CUDA only (the same as
FUSED's) and raises "Unrecognized or unsupported compute kernel" for it on a CPU
topology; ``make_planner`` gives it both, through the estimator's documented
``kernel_device_bandwidths`` override.
"""

from typing import Dict, Optional

from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

from tbe_plugin.torchrec._compat import triton_kernel

# Our kernel's speed relative to FBGEMM's FUSED, which TorchRec prices at 1x the memory
# bandwidth. 1.0, FBGEMM's price, until a benchmark at a stated commit writes a measured
# one: no current measurement is wired in yet (the last, sharded_h200.md, is in
# benchmarks/results/history/: it timed a backward that has been replaced since).
TRITON_BANDWIDTH_FACTOR = 1.0


def make_planner(
    topology: Topology,
    batch_size: int = 512,
    constraints: Optional[Dict[str, ParameterConstraints]] = None,
    triton_bandwidth_factor: float = TRITON_BANDWIDTH_FACTOR,
) -> EmbeddingShardingPlanner:
    """``EmbeddingShardingPlanner`` on ``topology`` whose estimates price FUSED_TRITON at
    ``triton_bandwidth_factor`` x the memory bandwidth of the device it runs on (DDR on
    CPU, HBM on GPU; TorchRec prices FBGEMM's FUSED at 1x; for the default see
    ``TRITON_BANDWIDTH_FACTOR``)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
    from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimatorFactory
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

    config = EmbeddingPerfEstimatorConfig()
    config.kernel_device_bandwidths = {
        ("cpu", triton_kernel()): triton_bandwidth_factor * topology.ddr_mem_bw,
        ("cuda", triton_kernel()): triton_bandwidth_factor * topology.hbm_mem_bw,
    }
    estimators = [
        EmbeddingPerfEstimatorFactory.create_with_config(config, topology=topology, constraints=constraints),
        EmbeddingStorageEstimator(topology=topology, constraints=constraints),
    ]
    enumerator = EmbeddingEnumerator(topology, batch_size, constraints, estimator=estimators)
    return EmbeddingShardingPlanner(
        topology=topology, batch_size=batch_size, constraints=constraints, enumerator=enumerator
    )
