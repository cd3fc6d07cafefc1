"""The forward of 16-bit rows alone: ``python -m tbe_plugin.benchmarks.probe_16bit_forward``.

The kernel suite's fp16 and bf16 configs (32 tables of 1e6 rows, D=128, B=8192, 20 ids a bag,
uniform ids) through our module only, no FBGEMM and no alternating provider: the launch
configs the forward used and its median time (``triton.testing.do_bench``) without and with
grad mode. Written to check the suite's bf16 forward (0.490 ms at 72a90d0, on FBGEMM's
generate_requests ids, CUDA events a call) against the tile sweep's 0.414 ms for the same
tile: here, on our uniform ids with do_bench, on the H200 at 3148cea, 0.423 ms (fp16 0.405).
"""

import torch
import triton

import tbe_plugin.ops.embedding_forward as forward
from tbe_plugin import TritonTableBatchedEmbeddingBags
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch


def main() -> None:
    seen = []
    launch = forward.forward_into

    def recording(*args, **kwargs):
        seen.append(args[-1])
        return launch(*args, **kwargs)

    forward.forward_into = recording
    try:
        for precision in ("fp16", "bf16"):
            tables = tuple(TableWorkload(rows=1_000_000, dim=128, mean_pooling=20, pooling="fixed") for _ in range(32))
            workload = Workload("probe", tables, 8192, weights_precision=precision)
            emb = TritonTableBatchedEmbeddingBags([(t.rows, t.dim) for t in tables],
                                                  weights_precision=precision.upper(), bounds_check_mode="WARNING",
                                                  device="cuda")  # fmt: skip
            emb.init_embedding_weights_uniform(-1, 1)
            indices, offsets, _ = generate_batch(workload, 0, "cuda")
            seen.clear()
            emb(indices, offsets)
            configs = list(seen)
            def timed():
                return triton.testing.do_bench(lambda: emb(indices, offsets), warmup=10, rep=100, return_mode="median")

            with torch.no_grad():
                no_grad = timed()
            grad = timed()
            print(f"{precision} align {emb._align} configs {configs} no_grad {no_grad:.4f} grad {grad:.4f} ms",
                  flush=True)
    finally:
        forward.forward_into = launch


if __name__ == "__main__":
    main()
