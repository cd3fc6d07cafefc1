"""The Zipf generator produces the stated law; batches have FBGEMM's layout and the stated
pooling; the workload builders stay within their stated ranges and memory.

Statistical checks draw from fixed seeds, so they are deterministic; their tolerances are
stated in sigmas of the binomial count (or of the difference of two independent samples)
so that a wrong law fails by far more than the tolerance.
"""

import math

import pytest
import torch

from tbe_plugin.workloads import (
    CTR_MIX_MAX_WEIGHT_BYTES, EXACT_HEAD_RANKS, HOT_ROW_FRACTION, TableWorkload, Workload, ZipfSampler, ZipfTables,
    ctr_mix, ctr_tables_dlrm, generate_batch, skew_stats, table_sampler, zipf_pmf, zipf_tables,
)

SIGMAS = 6.0


def one_table(rows: int, alpha: float, batch_size: int, **table) -> Workload:
    return Workload("test", (TableWorkload(rows=rows, dim=4, alpha=alpha, **table),), batch_size)


def exact_ranks(pmf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse CDF of the exact law, from the full float64 cumulative sum."""
    cdf = torch.cumsum(pmf, 0)
    return torch.searchsorted(cdf, uniform, right=True).clamp_(max=pmf.numel() - 1) + 1


def test_zipf_pmf_is_the_stated_law():
    pmf = zipf_pmf(1000, 1.2)
    assert pmf.dtype == torch.float64 and pmf.numel() == 1000
    assert math.isclose(float(pmf.sum()), 1.0, rel_tol=1e-12)
    k = torch.tensor([1.0, 2.0, 10.0, 1000.0], dtype=torch.float64)
    ratios = pmf[k.long() - 1] / pmf[0]
    torch.testing.assert_close(ratios, k.pow(-1.2), rtol=1e-12, atol=0)
    torch.testing.assert_close(zipf_pmf(7, 0.0), torch.full((7,), 1 / 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="alpha"):
        zipf_pmf(10, -0.5)
    with pytest.raises(ValueError, match="num_rows"):
        ZipfSampler(0, 1.0, seed=0)


@pytest.mark.parametrize("rows, alpha", [
    (100, 1.2),                          # head only
    (50_000, 0.0), (50_000, 0.5),        # uniform and sub-linear tails
    (100_000, 1.0), (100_000, 1.2),      # alpha = 1 (log tail) and CTR skew
    (20_000, 2.5),                       # steep: almost no tail mass
    (5_000_000, 1.05),                   # the largest CTR table
])
def test_inverse_cdf_is_exact_inverse_cdf_of_the_law(rows, alpha):
    """Each u maps to the rank the exact float64 CDF gives, head and integrated tail alike:
    at most a handful of u (those within ~1e-8 of a rank boundary) move by one rank."""
    sampler = ZipfSampler(rows, alpha, seed=3)
    uniform = torch.rand(200_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # u near 1 reaches the deepest tail ranks, where the approximation is weakest.
    uniform = torch.cat([uniform, 1 - torch.logspace(-1, -12, 1000, dtype=torch.float64)])
    got, want = sampler.ranks_from_uniform(uniform), exact_ranks(zipf_pmf(rows, alpha), uniform)
    assert got.min() >= 1 and got.max() <= rows
    differ = got != want
    assert int(differ.sum()) <= 5, (rows, alpha, int(differ.sum()))
    assert int((got - want).abs().max()) <= 1
    if rows > EXACT_HEAD_RANKS and alpha < 2:
        assert (want > EXACT_HEAD_RANKS).any()  # the tail really was exercised


@pytest.mark.parametrize("rows, alpha", [(1000, 0.0), (5000, 1.0), (20_000, 1.2)])
def test_sampled_frequencies_and_skew_match_the_law(rows, alpha):
    """Top ranks' frequencies within SIGMAS binomial sigmas of the pmf; the batch's hot-1%
    share and distinct fraction within SIGMAS sigmas of an exact multinomial draw's (both
    are order statistics of the batch, so the reference is a draw, not a sum of the pmf)."""
    count = 400_000
    workload = one_table(rows, alpha, batch_size=count, pooling="fixed", mean_pooling=1)
    indices, offsets, _ = generate_batch(workload, seed=11, device="cpu")
    sampler = ZipfSampler(rows, alpha, seed=0)  # generate_batch seeds table t's bijection with t
    ranks = sampler.row_to_rank(indices)
    pmf = zipf_pmf(rows, alpha)
    frequency = torch.bincount(ranks - 1, minlength=rows).double() / count
    top = pmf[:20]
    sigma = (top * (1 - top) / count).sqrt()
    assert ((frequency[:20] - top).abs() <= SIGMAS * sigma + 1e-12).all(), (frequency[:20], top)
    if alpha == 0.0:  # uniform: equal-width rank bins hold equal shares
        bins = frequency.view(20, -1).sum(1)
        assert ((bins - 0.05).abs() <= SIGMAS * math.sqrt(0.05 * 0.95 / count)).all(), bins
    reference = torch.multinomial(pmf, count, replacement=True, generator=torch.Generator().manual_seed(5))
    got, want = skew_stats(workload, indices, offsets), skew_stats(workload, reference, offsets)
    hot = want["hot1pct_share"]
    assert abs(got["hot1pct_share"] - hot) <= SIGMAS * math.sqrt(2 * hot * (1 - hot) / count), (got, want)
    distinct = want["distinct_fraction"]
    assert abs(got["distinct_fraction"] - distinct) <= SIGMAS * math.sqrt(2 * distinct * (1 - distinct) / count)
    if alpha > 0:  # and the share is what the law puts on its top ranks, up to that bias
        assert got["hot1pct_share"] >= float(pmf[: math.ceil(HOT_ROW_FRACTION * rows)].sum()) - 0.01


# (rows, alpha): a head-only table, a tail at alpha 1 (the log branch), uniform, steep, one row, big.
LAWS = ((1000, 1.2), (1_000_003, 1.05), (5, 0.0), (20_000, 1.0), (EXACT_HEAD_RANKS, 1.3), (3_000_000, 0.0),
        (9000, 2.5), (1, 1.1))  # fmt: skip


def test_zipf_tables_give_each_tables_own_ranks_and_rows_exactly():
    """``ZipfTables`` (every table in one set of kernels) is each table's ``ZipfSampler``
    on the same uniforms, bit for bit: random ones, and every head CDF value with its
    neighbours (where a float and an integer comparison could disagree)."""
    tables = zipf_tables(LAWS)
    g = torch.Generator().manual_seed(3)
    uniforms, table_of = [], []
    for t, sampler in enumerate(tables.samplers):
        cdf = sampler._head_cdf_cpu[sampler._head_cdf_cpu < 1.0]
        edges = torch.cat([cdf, torch.nextafter(cdf, torch.zeros_like(cdf)), torch.nextafter(cdf, torch.ones_like(cdf))])
        u = torch.cat([torch.rand(50_000, dtype=torch.float64, generator=g), edges, torch.tensor([0.0])])
        u = torch.floor(u * 2.0**53) / 2.0**53  # torch.rand's grid (ZipfTables.UNIFORM_BITS)
        uniforms.append(u)
        table_of.append(torch.full((u.numel(),), t))
    u, table_of = torch.cat(uniforms), torch.cat(table_of)
    ranks = tables.ranks_from_uniform(u, table_of)
    rows = tables.rank_to_row(ranks, table_of)
    for t, (num_rows, alpha) in enumerate(LAWS):
        mine = table_of == t
        own = table_sampler(num_rows, alpha, t)
        assert torch.equal(ranks[mine], own.ranks_from_uniform(u[mine])), (num_rows, alpha)
        assert torch.equal(rows[mine], own.rank_to_row(own.ranks_from_uniform(u[mine]))), (num_rows, alpha)


def test_zipf_tables_sample_table_after_table_and_refuse_bad_input():
    tables = zipf_tables(LAWS)
    counts = [3000, 0, 7, 2500, 100, 1, 40, 5]
    ids = tables.sample(counts, torch.Generator().manual_seed(0))
    assert ids.dtype == torch.int64 and ids.numel() == sum(counts)
    for t, part in enumerate(ids.split(counts)):
        assert part.numel() == 0 or (part.min() >= 0 and part.max() < LAWS[t][0])
    hot = tables.samplers[0].rank_to_row(torch.tensor([1]))
    assert int(torch.bincount(ids[:3000]).argmax()) == int(hot)  # table 0's hottest row is where its sampler puts it
    assert torch.equal(ids, tables.sample(counts, torch.Generator().manual_seed(0)))
    # the vectorized path (CUDA's default) and the per-table one (the CPU's) give the same ids
    assert torch.equal(ids, tables.sample(counts, torch.Generator().manual_seed(0), vectorized=True))
    with pytest.raises(ValueError, match="8 tables"):
        tables.sample([1, 2], torch.Generator())
    with pytest.raises(ValueError, match="float64"):
        tables.ranks_from_uniform(torch.rand(3), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least one"):
        ZipfTables([])


@pytest.mark.parametrize("rows", [1, 2, 97, 1024, 1_000_003])
def test_rank_to_row_is_a_bijection_scattering_hot_rows(rows):
    sampler = ZipfSampler(rows, 1.1, seed=7)
    ranks = torch.arange(1, rows + 1)
    mapped = sampler.rank_to_row(ranks)
    assert torch.equal(torch.sort(mapped).values, torch.arange(rows))
    assert torch.equal(sampler.row_to_rank(mapped), ranks)
    if rows >= 97:
        assert not torch.equal(mapped[:10], torch.arange(10))  # hot rows are not rows 0..9
        assert not torch.equal(mapped, ZipfSampler(rows, 1.1, seed=8).rank_to_row(ranks))


def test_batch_layout_ids_in_range_and_index_dtypes():
    tables = (TableWorkload(rows=50, dim=4, mean_pooling=3, alpha=1.2),
              TableWorkload(rows=7, dim=8, mean_pooling=2, pooling="fixed", alpha=0.0),
              TableWorkload(rows=1000, dim=4, mean_pooling=0.5, alpha=1.0))
    for index_dtype in ("int64", "int32"):
        workload = Workload("layout", tables, batch_size=33, weighted=True, index_dtype=index_dtype)
        indices, offsets, weights = generate_batch(workload, seed=2, device="cpu")
        assert indices.dtype == offsets.dtype == getattr(torch, index_dtype)
        assert offsets.numel() == 3 * 33 + 1 and int(offsets[0]) == 0 and int(offsets[-1]) == indices.numel()
        assert (offsets[1:] >= offsets[:-1]).all()
        assert weights.dtype == torch.float32 and weights.shape == indices.shape
        bounds = offsets[::33].tolist()
        for t, table in enumerate(tables):
            ids = indices[bounds[t] : bounds[t + 1]]
            assert ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < table.rows), t
        assert torch.equal(torch.diff(offsets[33:67]), torch.full((33,), 2, dtype=offsets.dtype))
    unweighted = Workload("layout", tables, batch_size=33)
    assert generate_batch(unweighted, seed=2, device="cpu")[2] is None


def test_poisson_lengths_have_the_stated_mean_and_cap():
    batch_size, mean = 20_000, 7.5
    _, offsets, _ = generate_batch(one_table(100, 1.0, batch_size, mean_pooling=mean), seed=0, device="cpu")
    lengths = torch.diff(offsets).double()
    assert abs(float(lengths.mean()) - mean) <= SIGMAS * math.sqrt(mean / batch_size)
    assert abs(float(lengths.var()) - mean) <= 0.05 * mean  # Poisson: variance = mean
    assert int((lengths == 0).sum()) > 0  # e^-7.5 * 20000 ~ 11 empty bags
    capped = one_table(100, 1.0, batch_size, mean_pooling=mean, max_pooling=5)
    capped_lengths = torch.diff(generate_batch(capped, seed=0, device="cpu")[1])
    assert int(capped_lengths.max()) == 5 and float(capped_lengths.double().mean()) < 5
    fixed = one_table(100, 1.0, 10, mean_pooling=2.6, pooling="fixed")
    assert torch.equal(torch.diff(generate_batch(fixed, seed=0, device="cpu")[1]), torch.full((10,), 3))


def test_batches_are_deterministic_per_seed():
    workload = ctr_mix(num_tables=4, batch_size=64, seed=1)
    first, again, other = (generate_batch(workload, seed=s, device="cpu") for s in (5, 5, 6))
    assert all(torch.equal(a, b) for a, b in zip(first[:2], again[:2]))
    common = min(first[0].numel(), other[0].numel())
    assert not torch.equal(first[0][:common], other[0][:common]) and not torch.equal(first[1], other[1])
    sampler = ZipfSampler(1000, 1.1, seed=0)
    draw = lambda: sampler.sample(100, torch.Generator().manual_seed(9))  # noqa: E731
    assert torch.equal(draw(), draw())


def test_skew_stats_counts_a_known_batch():
    tables = (TableWorkload(rows=100, dim=4, mean_pooling=3), TableWorkload(rows=300, dim=4, mean_pooling=2))
    workload = Workload("known", tables, batch_size=2)
    # table 0: rows 5,5,5,1,2,5 (bags of 3); table 1: rows 9,9,8,7 (bags of 2).
    indices = torch.tensor([5, 5, 5, 1, 2, 5, 9, 9, 8, 7])
    offsets = torch.tensor([0, 3, 6, 8, 10])
    stats = skew_stats(workload, indices, offsets)
    assert stats["lookups"] == 10 and stats["max_run"] == 4 and stats["distinct_per_table"] == [3, 3]
    assert stats["distinct_fraction"] == pytest.approx(6 / 10)
    # hottest 1 row of table 0 (row 5: 4 lookups) and 3 rows of table 1 (9, 9, 8, 7: 4 lookups).
    assert stats["hot1pct_share"] == pytest.approx(8 / 10)
    # every table has at most 3 distinct rows: the 16, 64 and 256 hottest of each take every lookup.
    assert stats["top_rows_share"] == {"16": 1.0, "64": 1.0, "256": 1.0}
    # 20 distinct rows once each and row 7 twenty times: the 16 hottest take 20 + 15 of 40.
    wide = Workload("wide", (TableWorkload(rows=100, dim=4, mean_pooling=40),), batch_size=1)
    ids = torch.cat([torch.full((20,), 7), torch.arange(20, 40)])
    share = skew_stats(wide, ids, torch.tensor([0, 40]))["top_rows_share"]
    assert share["16"] == pytest.approx(35 / 40) and share["64"] == 1.0
    with pytest.raises(ValueError, match="offsets"):
        skew_stats(workload, indices, offsets[:3])


def test_ctr_mix_stays_in_its_stated_ranges_and_memory():
    workload = ctr_mix()
    assert workload.num_tables == 100 and workload.batch_size == 16384 and workload.name == "ctr-mix"
    assert workload.weight_bytes <= CTR_MIX_MAX_WEIGHT_BYTES
    for table in workload.tables:
        assert 1e5 <= table.rows <= 5e6 and table.dim in (16, 32, 64, 128, 256)
        assert 1 <= table.mean_pooling <= 30 and 1.0 <= table.alpha <= 1.3 and table.pooling == "poisson"
    assert len(set(workload.dims)) == 5
    by_rows = sorted(workload.tables, key=lambda t: -t.rows)
    assert [t.dim for t in by_rows] == sorted(t.dim for t in by_rows)  # bigger tables, smaller D
    assert ctr_mix() == workload and ctr_mix(seed=1) != workload
    half = ctr_mix(weights_precision="fp16")
    assert half.tables == workload.tables and half.name == "ctr-mix-fp16"
    assert half.weight_bytes * 2 == workload.weight_bytes
    with pytest.raises(ValueError, match="max_weight_bytes"):
        ctr_mix(max_weight_bytes=10**9)


def test_ctr_tables_dlrm_share_one_dim():
    tables = ctr_tables_dlrm()
    assert len(tables) == 30 and {t.dim for t in tables} == {128}
    assert all(1e5 <= t.rows <= 5e6 and 1 <= t.mean_pooling <= 60 and 1.05 <= t.alpha <= 1.3 for t in tables)
    assert ctr_tables_dlrm() == tables and ctr_tables_dlrm(num_tables=3, dim=16, seed=2)[0].dim == 16


@pytest.mark.parametrize("bad, match", [
    (dict(rows=0), "rows"), (dict(dim=0), "dim"), (dict(mean_pooling=-1.0), "mean_pooling"),
    (dict(pooling="zipf"), "pooling"), (dict(alpha=-0.1), "alpha"), (dict(alpha=math.nan), "alpha"),
    (dict(pooling="fixed", mean_pooling=4, max_pooling=3), "max_pooling"),
])
def test_table_workload_rejects_bad_fields(bad, match):
    with pytest.raises(ValueError, match=match):
        TableWorkload(**(dict(rows=10, dim=4, mean_pooling=2.0) | bad))


@pytest.mark.parametrize("bad, match", [
    (dict(tables=()), "tables"), (dict(batch_size=0), "batch_size"), (dict(weights_precision="int8"), "weights_precision"),
    (dict(pooling_mode="max"), "pooling_mode"), (dict(weighted=True, pooling_mode="mean"), "per-sample"),
    (dict(index_dtype="int16"), "index_dtype"),
])
def test_workload_rejects_bad_fields(bad, match):
    fields = dict(name="bad", tables=(TableWorkload(rows=10, dim=4, mean_pooling=2.0),), batch_size=4) | bad
    with pytest.raises(ValueError, match=match):
        Workload(**fields)


@pytest.mark.gpu
def test_cuda_sampling_matches_the_law_and_is_deterministic():
    sampler = ZipfSampler(2_000_000, 1.15, seed=4)
    uniform = torch.rand(500_000, dtype=torch.float64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    assert torch.equal(sampler.ranks_from_uniform(uniform).cpu(), sampler.ranks_from_uniform(uniform.cpu()))
    ids = sampler.sample(1000, torch.Generator("cuda").manual_seed(3))
    assert ids.is_cuda and torch.equal(ids, sampler.sample(1000, torch.Generator("cuda").manual_seed(3)))
    workload = ctr_mix(num_tables=8, batch_size=256, weights_precision="fp16")
    indices, offsets, _ = generate_batch(workload, seed=0, device="cuda")
    assert indices.is_cuda and offsets.numel() == 8 * 256 + 1 and int(offsets[-1]) == indices.numel()
