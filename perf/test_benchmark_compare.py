"""``pytest perf/test_benchmark.py --benchmark-compare`` on a real case, as its users run it: the
plain and assisted arms and the gating ratio compared round by round against the committed baseline
of the platform, drawn by ``--benchmark-histogram``, written by ``--benchmark-json``; and a compare
that would read another case's numbers as this one's fails instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.experiments import bench
from harness.pairs import models
from harness.settings import baselines

pytestmark = [pytest.mark.perf, pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "baselines"
SELECTION = f"test_benchmark_real and {models.DEFAULT_PAIR}-registered"
ROUNDS = 5


def _pytest(tmp_path: Path, *args: str, selection: str = SELECTION) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASSISTED_GENERATION_RUNS": str(tmp_path / "runs")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "perf/test_benchmark.py", "-k", selection,
         "--perf-repetitions", str(ROUNDS), "--allow-inconclusive", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


def _held_to(platform_name: str) -> str:
    """The platform whose committed baseline this host's compare reads (its own where it has one)."""
    case = bench.registered_case(models.get_pair(models.DEFAULT_PAIR))
    return baselines.baseline_platform(COMMITTED, platform_name, case.key())


def test_benchmark_compare_shows_real_rounds_of_both_arms_against_the_platforms_baseline(
    tmp_path, platform_name, pairs
):
    pairs.require_weights(models.DEFAULT_PAIR)
    held_to = _held_to(platform_name)
    case_id = bench.registered_case(models.get_pair(models.DEFAULT_PAIR)).case_id
    out = tmp_path / "bench.json"
    done = _pytest(
        tmp_path, "--platform", held_to, "--benchmark-compare", "--benchmark-columns=min,median,max,rounds",
        f"--benchmark-json={out}", f"--benchmark-histogram={tmp_path / 'hist' / 'case'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    # pytest-benchmark's own table: each entry against the committed run, with its rounds.
    stored = {r.case.case_id: r for r in baselines.platform_records(COMMITTED, held_to)}[case_id]
    stored_rounds = len(stored.tokens_per_s["plain"]["samples"])
    for arm in baselines.ARMS:
        name = re.escape(f"test_benchmark_real[{models.DEFAULT_PAIR}-registered-{arm}]")
        base = re.search(name + r" \(0001_baselin\)\s.*?\s(\d+)\s*$", done.stdout, re.M)
        now = re.search(name + r" \(NOW\)\s.*?\s(\d+)\s*$", done.stdout, re.M)
        assert base and now, (arm, done.stdout[-6000:])
        assert int(base.group(1)) == stored_rounds >= 5 and int(now.group(1)) >= ROUNDS, (base[0], now[0])
    # The JSON holds the rounds themselves: each an arm's time per token, or their ratio per round.
    entries = {e["extra_info"]["arm"]: e for e in json.loads(out.read_text())["benchmarks"]}
    plain, assisted = (entries[a]["stats"]["data"] for a in ("plain", "assisted"))
    assert len(plain) == len(assisted) == entries["ratio"]["stats"]["rounds"] >= ROUNDS
    assert entries["ratio"]["stats"]["data"] == pytest.approx(
        [a / p for p, a in zip(plain, assisted, strict=True)]
    )
    assert entries["ratio"]["extra_info"]["gate"]["speedup"] in ("pass", "improvement", "inconclusive")
    assert {e["extra_info"]["case_id"] for e in entries.values()} == {case_id}
    # The histogram draws the arms' distributions (this run's and the baseline's) and the ratio's.
    drawn = sorted(p.name for p in (tmp_path / "hist").glob("*.svg"))
    assert len(drawn) == 2 and any(name.endswith("ratio.svg") for name in drawn), drawn


def test_a_compare_never_reads_another_cases_numbers_as_this_ones(tmp_path, platform_name, pairs):
    """A stored run whose entry under this test's name measured another configuration (the
    registered one changed since) fails the compare with what to do, before measuring anything,
    instead of comparing them."""
    pairs.require_weights(models.DEFAULT_PAIR)
    held_to = _held_to(platform_name)
    storage = tmp_path / "storage"
    storage.mkdir()
    shutil.copy(baselines.storage_file(COMMITTED, held_to), storage / baselines.STORAGE_FILE)
    doc = json.loads((storage / baselines.STORAGE_FILE).read_text())
    plain = f"perf/test_benchmark.py::test_benchmark_real[{models.DEFAULT_PAIR}-registered-plain]"
    (entry,) = [e for e in doc["benchmarks"] if e["fullname"] == plain]
    entry["extra_info"]["case_id"] = "benchmark-p128-n32-t_fp32-d_fp32-k9-constant-greedy"
    (storage / baselines.STORAGE_FILE).write_text(json.dumps(doc))
    done = _pytest(tmp_path, "--platform", held_to, f"--benchmark-storage={storage}", "--benchmark-compare",
                   selection=f"{SELECTION} and plain")  # fmt: skip
    assert done.returncode == 1, done.stdout[-4000:]
    assert (
        "holds case benchmark-p128-n32-t_fp32-d_fp32-k9-constant-greedy under this test's name" in done.stdout
    )
    assert "1 failed" in done.stdout and "--update-baselines" in done.stdout
    # Refused before measuring: not one decode ran, so no benchmark row was written.
    assert not list((tmp_path / "runs").rglob("*.jsonl")), list((tmp_path / "runs").rglob("*"))
