"""The one interleaved, rotating measurement order every experiment uses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harness.experiments import experiment


@given(st.integers(1, 12), st.integers(1, 5))
def test_every_item_runs_every_arm_once_and_no_arm_always_runs_first(n_items, n_arms):
    arms = [f"arm{a}" for a in range(n_arms)]
    jobs = experiment.interleave(list(range(n_items)), arms)
    assert len(jobs) == n_items * n_arms
    for i in range(1, n_items + 1):
        mine = [j for j in jobs if j.index == i]
        assert sorted(j.arm for j in mine) == arms
        assert [j.position for j in mine] == list(range(n_arms))
    firsts = [j.arm for j in jobs if j.position == 0]
    # the first place goes round the arms: over n_arms items, each arm starts once
    assert firsts[: min(n_items, n_arms)] == arms[: min(n_items, n_arms)]


def test_run_measures_in_rotated_order_returns_in_arm_order_and_skips_stored(capsys):
    jobs = experiment.interleave(["p1", "p2"], ["plain", "assisted"])
    ran = []

    def measure(job):
        ran.append((job.item, job.arm))
        return f"{job.item}-{job.arm}"

    def stored(job):
        return "p1-plain(stored)" if (job.item, job.arm) == ("p1", "plain") else None

    got = experiment.run(jobs, measure, stored=stored, resumed_from="rows.jsonl", progress=False)
    assert ran == [("p1", "assisted"), ("p2", "assisted"), ("p2", "plain")]
    assert got == ["p1-plain(stored)", "p1-assisted", "p2-plain", "p2-assisted"]
    assert "resumed 1 of 4 runs from rows.jsonl" in capsys.readouterr().err


def test_each_arm_is_warmed_up_before_the_clock_and_the_preparation_is_said(capsys) -> None:
    """One-time costs (kernel builds, caches, first touch) land in an unmeasured run of each arm's
    first pending job, before any measured one, and the time they took is printed."""
    from harness.experiments import experiment

    events: list[tuple[str, int, str]] = []
    jobs = experiment.interleave(["p1", "p2"], ["plain", "assisted"])
    done = experiment.run(
        jobs,
        lambda job: events.append(("measure", job.index, job.arm)) or job.arm,
        warmup=lambda job: events.append(("warmup", job.index, job.arm)),
        stored=lambda job: "stored" if job.index == 1 and job.arm == "plain" else None,
        progress=False,
    )
    warmups = [e for e in events if e[0] == "warmup"]
    assert sorted(warmups) == [("warmup", 1, "assisted"), ("warmup", 2, "plain")]  # first pending per arm
    assert events[: len(warmups)] == warmups  # before anything measured
    assert len(done) == 4 and done.count("stored") == 1
    assert "prepared in " in capsys.readouterr().err
