"""``ops.radix_sort.sort_pairs`` against ``torch.sort``: ``python -m tbe_plugin.benchmarks.probe_radix_sort``.

The backward's sort at the suite's sizes: 5.2M keys (b8192), 15.4M (the end-to-end DLRM's
batch), 41.9M (b65536), keys of 22 and 25 bits (3.2M and 30M rows of all tables), uniform
and skewed (``--alpha``, ``_keys``). Per size: ``torch.sort(stable=True)`` then gathering an int32
value by its permutation (what the backward does now), and ``sort_pairs`` with int32 values
under each (tile, warps) asked for; every result checked bitwise against torch's; median ms
of ``triton.testing.do_bench``, the bytes each moves and the device ms of each kernel of one
call (torch.profiler; torch.sort's too, on the first shape). Variants: ``RadixSizes`` as
TILExWARPSxDIGIT_BITSxSUB_TILE, ``xmatch`` for the comparison ranking. JSON to ``--out``.
"""

import argparse
import json
import os

import torch
import triton

import tbe_plugin.ops.radix_sort as radix
from tbe_plugin.ops.backward_launch import RadixSizes
from tbe_plugin.benchmarks.common import collect_environment


def _keys(n: int, bits: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """n keys below 2**bits: uniform (alpha 0), or ranks r >= 1 drawn as floor(u**(-1 / (alpha
    - 1))) (a Pareto tail: P(rank >= r) = r**(1 - alpha)), capped at 2**bits, scattered over
    the key range by a fixed odd multiplier."""
    if alpha == 0:
        return torch.randint(0, 1 << bits, (n,), generator=generator, dtype=torch.int32, device="cuda")
    u = torch.rand(n, generator=generator, dtype=torch.float64, device="cuda")
    ranks = u.pow(-1.0 / (alpha - 1.0)).floor().clamp_(max=float(1 << bits)).to(torch.int64)
    return ((ranks * 2654435761) % (1 << bits)).to(torch.int32)


def _kernel_split(run) -> dict:
    """Device ms per kernel name of one call of ``run`` (torch.profiler), names cut to 60."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    split: dict = {}
    for event in prof.key_averages():  # as profile_backward.kernel_breakdown reads them
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us:
            split[event.key[:60]] = round(split.get(event.key[:60], 0.0) + device_us / 1e3, 4)
    return split


def _variant(text: str) -> RadixSizes:
    """TILExWARPSxDIGIT_BITSxSUB_TILE, with an optional last field ``match`` (the ranking)."""
    fields = text.split("x")
    tile, warps, digit, sub = (int(x) for x in fields[:4])
    ranking = fields[4] if len(fields) > 4 else "sort"
    return RadixSizes(tile=tile, sub_tile=sub, warps=warps, digit_bits=digit, ranking=ranking)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--sizes", default="5242880,15379196,41943040")
    parser.add_argument("--bits", default="22,25")
    parser.add_argument("--alpha", type=float, default=1.2)
    parser.add_argument("--variants", default="4096x8x8x512,4096x1x8x32xmatch,4096x2x8x64xmatch,2048x4x8x64xmatch",
                        help="TILExWARPSxDIGIT_BITSxSUB_TILE[xmatch] of the histogram and scatter kernels (RadixSizes)")
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        for bits in (int(b) for b in args.bits.split(",")):
            for alpha in (0.0, args.alpha):
                keys = _keys(n, bits, alpha, generator)
                values = torch.randint(0, 1 << 30, (n,), dtype=torch.int32, device="cuda")
                ref_keys, perm = torch.sort(keys, stable=True)
                ref_values = values[perm]
                entry = {"n": n, "bits": bits, "alpha": alpha,
                         "torch_sort_ms": triton.testing.do_bench(lambda: values[torch.sort(keys, stable=True)[1]]),
                         "variants": {}}  # fmt: skip
                if len(results) == 0:  # the first shape: where torch.sort's time goes, kernel by kernel
                    entry["torch_sort_split"] = _kernel_split(lambda: values[torch.sort(keys, stable=True)[1]])
                for variant in args.variants.split(","):
                    sizes = _variant(variant)
                    out_keys, out_values = radix.sort_pairs(keys, values, bits, sizes)
                    ok = torch.equal(out_keys, ref_keys) and torch.equal(out_values, ref_values)
                    ms = triton.testing.do_bench(lambda: radix.sort_pairs(keys, values, bits, sizes))
                    passes = len(radix.pass_bits(bits, sizes.digit_bits))
                    entry["variants"][variant] = {
                        "ms": ms, "bitwise_equal": ok, "passes": passes,
                        "tb_per_s": n * 20 * passes / ms / 1e9,  # a pass: keys read twice, keys+values read, written
                        "split": _kernel_split(lambda: radix.sort_pairs(keys, values, bits, sizes)),
                    }  # fmt: skip
                print(n, bits, alpha, "torch", round(entry["torch_sort_ms"], 3),
                      {v: (round(e["ms"], 3), e["bitwise_equal"]) for v, e in entry["variants"].items()})
                results.append(entry)
                del keys, values, ref_keys, perm, ref_values
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_radix_sort.json"), "w") as f:
        json.dump({"environment": collect_environment(torch.device("cuda")), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
