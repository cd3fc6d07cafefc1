"""Report helpers every benchmark shares: the commit measured, geomeans, markdown, files.

``common`` re-exports the ones its callers have always imported from it; this module
imports nothing from the project but ``tbe_plugin.provenance`` (``git_state``, re-exported
here), so anything may import it.
"""

import json
import math
from pathlib import Path

from tbe_plugin.provenance import git_state  # noqa: F401 (re-exported: the benchmarks' callers import it here)


SKEW_LEGEND = (
    "distinct = distinct (table, row) pairs / lookups in one request; hot1% = share of its "
    "lookups that fall in the hottest 1% of each table's rows (the ceil(0.01 * E_t) rows most "
    "frequent in that request), pooled over tables (``tbe_plugin.workloads.skew_stats``)."
)


def skew_cells(skew: dict | None) -> list[str]:
    """The ``distinct`` and ``hot1%`` cells of a config's row."""
    if skew is None:
        return ["n/a", "n/a"]
    return [f"{skew['distinct_fraction']:.0%}", f"{skew['hot1pct_share']:.0%}"]


def geomean(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else None


def geomeans(entries: list[dict], keys: list[str], production_only: bool = False) -> dict[str, float | None]:
    """Per ratio key, the geomean over ``entries`` (those marked ``production`` only, if asked)."""
    chosen = [e for e in entries if e.get("production") or not production_only]
    return {key: geomean([e["ratios"].get(key) for e in chosen]) for key in keys}


def production_names(entries: list[dict]) -> str:
    return ", ".join(dict.fromkeys(e["name"] for e in entries if e.get("production"))) or "none run"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(out_dir: str | Path, name: str, payload: dict) -> Path:
    """Write ``out_dir/name`` (JSON, the directory made if missing); return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def write_report(out_dir: str | Path, stem: str, payload: dict, markdown: str) -> tuple[Path, Path]:
    """Write ``out_dir/stem.json`` and ``out_dir/stem.md``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md_path.write_text(markdown + "\n")
    return json_path, md_path


def report_header(title: str, report: dict) -> list[str]:
    """The markdown lines every benchmark report starts with: title, commit and dirty flag,
    device and versions, copy bandwidth, method, where each config's inputs came from, and
    the seconds each config took (set up, check and timing)."""
    env, copy_bw = report["environment"], report["copy_bandwidth"]
    sources: dict[str, list[str]] = {}
    for entry in report["configs"]:
        sources.setdefault(entry["input_source"], []).append(entry["name"])
    dirty = {True: "dirty: " + ", ".join(env.get("git_changed", [])), False: "clean", None: "unknown"}
    return [
        title,
        "",
        f"- commit: {env['git_commit']} (tree {dirty[env['git_dirty']]})",
        f"- device: {env['device_name']} ({env['device']}, cuda {env.get('cuda', 'n/a')}); "
        f"torch {env['torch']}, triton {env['triton']}, fbgemm_gpu {env['fbgemm_gpu']}, "
        f"python {env['python']}, TRITON_INTERPRET={env['triton_interpret']}",
        f"- copy bandwidth: {copy_bw['tbps']:.3f} TB/s (device-to-device copy_ of "
        f"{copy_bw['bytes_per_copy'] / 2 / 2**30:.3g} GiB, read + write counted)",
        f"- method: {report['method']}",
        *(f"- inputs ({', '.join(names)}): {source}" for source, names in sources.items()),
        f"- wall time: {_wall_times(report['configs'])}",
    ]


def _wall_times(configs: list[dict]) -> str:
    timed = [(e["name"], e["elapsed_s"]) for e in configs if "elapsed_s" in e]
    if not timed:
        return "n/a"
    return f"{sum(s for _, s in timed):.0f} s (" + ", ".join(f"{name} {s:.1f}" for name, s in timed) + ")"
