"""What summing each table's hottest rows apart, as a dense product, would cost and save:
``python -m tbe_plugin.benchmarks.probe_hot_dense --out DIR``.

A design probe, not a backward. On a production-shaped batch (``--config``, the suite's
ctr-dlrm by default; every table of one D), per table the K hottest rows of the batch
(``--top``) take a share of the lookups (``workloads.skew_stats``' ``top_rows_share``). Their
gradient sums are ``counts @ G``: ``counts`` a (K x B) matrix of how often hot row k sits in
bag b (exact small integers in fp32, so any order of counting gives the same matrix) and ``G``
the table's (B x D) columns of the output gradient. This times, with CUDA events (median of
``--iters``):

- ``count_ms``: building every table's count matrix from the ids (``index_put_`` with
  accumulate; a fused kernel would do it in the pass that computes sort keys);
- ``product_ms``: the products for all tables (``torch.bmm``, fp32, TF32 off: full fp32
  products summed in a fixed order, so bitwise repeatable, though not in the pieces kernel's
  order); ``product_tf32_ms`` with TF32 on, a bound only (its rounding is not fp32's);
- ``product_triton_ms``: the same sums by ``ops.hot_product.hot_sums`` (fp32 dots in a fixed
  order) under each of ``TRITON_SIZES``, after a check against the fp64 product;
- the bytes the pieces kernel gathers for those lookups (each one's D x 4-byte gradient row),
  which the product would replace, and the ids the sort would no longer see.

Writes DIR/probe_hot_dense.json (with the commit and dirty flag). ``--smoke``: a tiny batch on
the CPU (the tests check the product against the gathered sums).
"""

import argparse
import statistics

import torch

from tbe_plugin.benchmarks.report import git_state, write_json
from tbe_plugin.ops.hot_product import hot_sums
from tbe_plugin.workloads import TableWorkload, Workload, generate_batch

SMOKE = Workload("smoke-hot", tuple(TableWorkload(rows=500, dim=8, mean_pooling=6, alpha=1.2) for _ in range(3)),
                 batch_size=64)  # fmt: skip


def hot_counts(workload: Workload, indices: torch.Tensor, offsets: torch.Tensor, top: int):
    """Per table its ``top`` most frequent rows in the batch (fewer where it has fewer
    distinct rows; the rest of the slots are row -1) and the (T, top, B) fp32 matrix of how
    often each sits in each bag, with the flat positions that build it (table, slot, bag
    per hot lookup) and the number of hot lookups."""
    T, B = workload.num_tables, workload.batch_size
    device = indices.device
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.repeat_interleave(torch.arange(T * B, device=device), lengths)
    hot_rows = torch.full((T, top), -1, dtype=torch.int64, device=device)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    tables, slots, bag_of = [empty], [empty], [empty]
    bounds = offsets[::B].tolist()
    for t in range(T):
        ids = indices[bounds[t] : bounds[t + 1]].long()
        rows, counts = torch.unique(ids, return_counts=True)
        k = min(top, rows.numel())
        if k == 0:
            continue
        order = torch.sort(counts, descending=True, stable=True).indices[:k]
        chosen = torch.sort(rows[order]).values
        hot_rows[t, :k] = chosen
        place = torch.searchsorted(chosen, ids).clamp_(max=k - 1)
        hit = chosen[place] == ids
        tables.append(torch.full((int(hit.sum()),), t, device=device))
        slots.append(place[hit])
        bag_of.append(bags[bounds[t] : bounds[t + 1]][hit] - t * B)
    where = (torch.cat(tables), torch.cat(slots), torch.cat(bag_of))
    counts = torch.zeros(T, top, B, dtype=torch.float32, device=device)
    counts.index_put_(where, torch.ones(where[0].numel(), device=device), accumulate=True)
    return hot_rows, counts, where


def hot_products(counts: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(T, top, D): each table's hot rows' gradient sums, ``counts[t] @ grad[:, t*D:(t+1)*D]``."""
    T, _, B = counts.shape
    return torch.bmm(counts, grad.view(B, T, -1).transpose(0, 1))


def _median_ms(fn, iters: int) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


# ops.hot_product sizes timed: (split_b, block_b, block_d, num_warps).
TRITON_SIZES = ((1024, 32, 64, 4), (512, 32, 64, 4), (2048, 32, 64, 4), (1024, 64, 64, 4), (1024, 32, 128, 4),
                (1024, 32, 128, 8), (256, 32, 64, 4))  # fmt: skip


def _triton_sizes(counts: torch.Tensor, grad: torch.Tensor, D: int, iters: int, device: torch.device) -> dict:
    """Median ms of ``ops.hot_product.hot_sums`` per size in TRITON_SIZES (checked against the
    fp64 product first; a size that disagrees or fails to run is left out with its reason)."""
    if counts.shape[1] < 16:
        return {}
    T = counts.shape[0]
    col_offsets = torch.arange(T, device=device) * D
    dims = torch.full((T,), D, device=device)
    want = torch.bmm(counts.double(), grad.double().view(grad.shape[0], T, D).transpose(0, 1))
    out = {}
    for sizes in TRITON_SIZES if device.type == "cuda" else TRITON_SIZES[-1:]:
        key = "x".join(map(str, sizes))
        split_b, block_b, block_d, warps = sizes

        def run():
            return hot_sums(counts, grad, col_offsets, dims, split_b, block_b, block_d, warps)

        try:
            err = (run().double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        except Exception as exc:  # noqa: BLE001 -- a size that does not compile is reported, not fatal
            out[key + "_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        if err > 1e-5:
            out[key + "_error"] = f"relative error {err:.2e}"
            continue
        out[key] = _median_ms(run, iters)
    return {k: v for k, v in out.items() if not isinstance(v, float) or v == v}


def probe(workload: Workload, tops: list[int], iters: int, device: torch.device) -> dict:
    dims = {table.dim for table in workload.tables}
    if len(dims) != 1:
        raise ValueError(f"probe_hot_dense: the tables of {workload.name} have several D {sorted(dims)}; one is needed")
    D, T, B = dims.pop(), workload.num_tables, workload.batch_size
    indices, offsets, _ = generate_batch(workload, 0, device)
    grad = torch.randn(B, T * D, device=device, generator=torch.Generator(device).manual_seed(1))
    entries = []
    for top in tops:
        hot_rows, counts, where = hot_counts(workload, indices, offsets, top)
        hot = where[0].numel()

        def count():
            c = torch.zeros(T, top, B, dtype=torch.float32, device=device)
            c.index_put_(where, torch.ones(hot, device=device), accumulate=True)

        torch.backends.cuda.matmul.allow_tf32 = False
        product_ms = _median_ms(lambda: hot_products(counts, grad), iters)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32_ms = _median_ms(lambda: hot_products(counts, grad), iters)
        torch.backends.cuda.matmul.allow_tf32 = False
        triton_ms = _triton_sizes(counts, grad, D, iters, device)
        entries.append({"top": top, "hot_lookups": hot, "share": hot / indices.numel(),
                        "gather_bytes_replaced": hot * D * 4, "count_ms": _median_ms(count, iters),
                        "product_ms": product_ms, "product_tf32_ms": tf32_ms, "product_triton_ms": triton_ms,
                        "product_flops": 2 * T * top * B * D})  # fmt: skip
        best = min(triton_ms.items(), key=lambda kv: kv[1]) if triton_ms else ("-", float("nan"))
        print(f"top {top}: {hot / indices.numel():.1%} of {indices.numel()} lookups, gather replaced "
              f"{hot * D * 4 / 1e9:.2f} GB; count {entries[-1]['count_ms']:.3f} ms, product {product_ms:.3f} ms "
              f"(tf32 {tf32_ms:.3f}; ops.hot_product best {best[1]:.3f} at {best[0]})", flush=True)  # fmt: skip
    return {"git": git_state(), "device": str(device), "workload": workload.name, "lookups": indices.numel(),
            "tables": T, "batch_size": B, "dim": D, "entries": entries}  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--config", default="ctr-dlrm", help="a production suite config of one D")
    parser.add_argument("--top", default="16,64,256")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="a tiny batch on the CPU")
    args = parser.parse_args(argv)
    if args.smoke:
        workload, device = SMOKE, torch.device("cpu")
    else:
        from tbe_plugin.benchmarks.suite import DEVICE_PRODUCTION

        configs = {cfg.name: cfg for cfg in DEVICE_PRODUCTION if isinstance(cfg, Workload)}
        if args.config not in configs:
            raise SystemExit(f"unknown config {args.config!r}; one of {', '.join(configs)}")
        workload, device = configs[args.config], torch.device("cuda")
    report = probe(workload, [int(k) for k in args.top.split(",")], args.iters, device)
    write_json(args.out, "probe_hot_dense.json", report)
    return report


if __name__ == "__main__":
    main()
