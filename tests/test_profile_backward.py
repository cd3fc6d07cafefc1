"""profile_backward's choice of the best candidate (read by scripts/device_bwd_next.sh to pick
the launch the backward suite runs with): by the geometric mean of FBGEMM's time over ours,
among candidates measured everywhere without error, with the first candidate's result and
nowhere slower than it beyond the noise."""

import pytest

from tbe_plugin.benchmarks.profile_backward import CANDIDATES, best_candidate


def entry(fbgemm_ms, **candidates):
    return {"fbgemm_bwd_ms": fbgemm_ms, "candidates": candidates}


def timed(ms, relative_diff=0.0):
    return {"bwd_ms": ms, "relative_diff": relative_diff}


def test_best_candidate_is_the_best_geomean_among_complete_and_correct_ones():
    report = {"entries": [
        entry(2.0, default=timed(4.0), pieces=timed(1.0), fast_but_wrong=timed(0.1, relative_diff=0.5)),
        entry(1.0, default=timed(1.0), pieces=timed(2.0), fast_but_wrong=timed(0.1), failed={"error": "x"}),
        entry(3.0, default=timed(3.0), pieces=timed(2.0), fast_but_wrong=timed(0.1)),
        {"candidates": {"default": timed(9.0)}},  # no FBGEMM time: not counted
    ]}  # fmt: skip
    # pieces: (2 * 0.5 * 1.5) ** (1/3) = 1.145; default: (0.5 * 1 * 1) ** (1/3) = 0.794; but pieces
    # doubles the second entry's time: not without a loss beyond the noise
    assert best_candidate(report) == "default"
    assert best_candidate(report, max_loss=1.0) == "pieces"
    report["entries"][1]["candidates"]["pieces"] = timed(1.019)  # under 2% slower there: within the noise
    assert best_candidate(report) == "pieces"
    failed_reference = {"entries": [entry(1.0, default={"error": "compile"}, slow=timed(5.0))]}
    with pytest.raises(ValueError, match="no candidate measured"):  # nothing to hold "slow" against
        best_candidate(failed_reference)
    del report["entries"][0]["candidates"]["pieces"]  # not measured everywhere: out
    assert best_candidate(report) == "default"


def test_best_candidate_refuses_a_report_it_cannot_rank():
    with pytest.raises(ValueError, match="no entry with FBGEMM's backward time"):
        best_candidate({"entries": [{"candidates": {"default": timed(1.0)}}]})
    with pytest.raises(ValueError, match="no candidate measured in all 1 entries"):
        best_candidate({"entries": [entry(1.0, default={"error": "compile"})]})


@pytest.mark.parametrize("name", ["device_bwd_next.sh", "device_merge.sh"])
def test_the_device_scripts_name_existing_candidates(name):
    """A device call lost to a misspelt candidate costs minutes of the session's device time."""
    from pathlib import Path
    import re

    script = (Path(__file__).resolve().parents[1] / "scripts" / name).read_text()
    named = re.search(r"CANDIDATES=\$\{CANDIDATES:-([\w,]+)\}", script).group(1).split(",")
    assert "default" in named and len(named) >= 2  # HEAD's default against at least one other
    assert set(named) <= set(CANDIDATES)
    singles = re.findall(r"CANDIDATE=\$\{CANDIDATE:-(\w+)\}", script)  # the end to end's and the suite's
    assert len(singles) == script.count("CANDIDATE=${CANDIDATE:-"), "a single candidate this test cannot read"
    singles += re.findall(r"\$\{c:-(\w+)\}", script)  # the fallback when no profile picked one
    if name == "device_merge.sh":  # its pick falls back to a named candidate
        assert len(singles) == 1 + script.count("CANDIDATE=${CANDIDATE:-"), "the pick's fallback: unreadable"
    assert set(singles) <= set(CANDIDATES), singles


def test_every_candidate_is_a_valid_launch():
    """Each candidate builds a RunsLaunch that passes its own checks (a device call that meets a
    rejected launch loses that candidate's whole entry)."""
    from tbe_plugin.ops.backward_launch import RunsLaunch

    for name, make in CANDIDATES.items():
        assert isinstance(make(), RunsLaunch), name
