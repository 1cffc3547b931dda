"""The committed baselines are pytest-benchmark storages, one per platform: its CLI lists and
compares them, and ``--benchmark-compare`` inputs that would compare nothing, or the wrong thing,
are refused before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import pytest_in_process

from harness.settings import baselines

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "baselines"
PLATFORMS = sorted(p.parent.name for p in baselines.list_baselines(COMMITTED))


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )  # fmt: skip


def _collect(pytester: pytest.Pytester, *args: str) -> subprocess.CompletedProcess:
    """Collect perf/test_benchmark.py with ``args``: the compare options are checked at configure time."""
    return pytest_in_process(pytester, "--collect-only", "-q", "perf/test_benchmark.py", *args)


def test_every_platform_has_one_storage_and_the_seeds_platforms_are_there():
    assert {"phx", "stx", "hpt", "amd-epyc-2c-avx512"} <= set(PLATFORMS)
    for folder in (p for p in COMMITTED.iterdir() if p.is_dir()):
        assert sorted(f.name for f in folder.rglob("*") if f.is_file()) == [baselines.STORAGE_FILE], folder


def test_pytest_benchmarks_cli_lists_and_compares_the_committed_baselines():
    storage = COMMITTED / "amd-epyc-2c-avx512"
    listed = _run("pytest-benchmark", "--storage", str(storage), "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [str(storage / baselines.STORAGE_FILE)]
    files = [str(p) for p in baselines.list_baselines(COMMITTED)]
    shown = _run("pytest-benchmark", "compare", "--columns=median,rounds", *files)
    assert shown.returncode == 0, shown.stderr
    # Every case the gate reads, on every platform (the seeds' imported ones too), is in its table
    # (how pytest-benchmark heads a group is its own business).
    for platform in PLATFORMS:
        for record in baselines.platform_records(COMMITTED, platform):
            assert record.case.case_id in shown.stdout, (platform, record.case.case_id)


def test_a_stored_case_reads_back_as_the_gate_reads_it():
    """The gate's samples are the entries' rounds: tokens/s = 1 / an arm's time per token, and each
    round's speedup = 1 / its ratio."""
    doc = json.loads(baselines.storage_file(COMMITTED, "amd-epyc-2c-avx512").read_text())
    for record in baselines.platform_records(COMMITTED, "amd-epyc-2c-avx512"):
        mine = {
            e["extra_info"]["arm"]: e
            for e in doc["benchmarks"]
            if e["extra_info"]["case_id"] == record.case.case_id
        }
        assert set(mine) == {"ratio", "assisted", "plain"}
        for arm in ("plain", "assisted"):
            rounds = mine[arm]["stats"]["data"]
            assert record.tokens_per_s[arm]["samples"] == pytest.approx([1 / t for t in rounds], rel=1e-12)
            assert mine[arm]["stats"]["median"] == pytest.approx(sorted(rounds)[len(rounds) // 2], rel=0.5)
        assert record.speedup["samples"] == pytest.approx(
            [1 / r for r in mine["ratio"]["stats"]["data"]], rel=1e-5
        )
        assert mine["ratio"]["fullname"].endswith("-ratio]") and mine["ratio"]["group"].endswith(" ratio")


def test_compare_alone_picks_this_platforms_committed_baseline(pytester):
    done = _collect(pytester, "--benchmark-compare", "--platform", "amd-epyc-2c-avx512")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0001_baseline.json" in done.stdout + done.stderr


def test_a_compare_says_in_one_line_which_machine_the_baseline_was_taken_on():
    # A process of its own: pytest-benchmark says it as a warning, which a process shows only once.
    done = _run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                "perf/test_benchmark.py", "--benchmark-compare",
                "--platform", "amd-epyc-2c-avx512")  # fmt: skip
    said = done.stdout + done.stderr
    assert "the compared run in" in said and "family 25 model 17" in said
    assert "machine_info is different" not in said  # pytest-benchmark's own note: both machines whole
    assert len(done.stderr) < 1000, done.stderr


def test_help_says_what_a_compare_compares_and_every_default(pytester):
    done = pytest_in_process(pytester, "--help")
    shown = " ".join(done.stdout.split())
    assert "committed baseline, baselines/<platform>/" in shown
    assert "(default: 5)" in shown.split("--perf-repetitions", 1)[1].split("--", 1)[0]


def test_a_platform_without_a_baseline_is_told_so_plainly(pytester):
    done = _collect(pytester, "--benchmark-compare", "--platform", "nowhere-1c")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "platform 'nowhere-1c' has no committed baseline" in done.stderr
    assert "--update-baselines" in done.stderr and "amd-epyc-2c-avx512" in done.stderr
    assert "Traceback" not in done.stderr


def test_compare_inputs_are_checked_before_anything_runs(pytester, tmp_path):
    missing = _collect(pytester, "--benchmark-compare", f"--benchmark-storage={tmp_path / 'none'}")
    assert missing.returncode == 4 and "no such folder" in missing.stderr, missing.stderr
    assert not (tmp_path / "none").exists()  # pytest-benchmark would have made it

    storage = tmp_path / "storage"
    storage.mkdir()
    shutil.copy(baselines.storage_file(COMMITTED, "amd-epyc-2c-avx512"), storage / "0001_baseline.json")
    nothing = _collect(pytester, f"--benchmark-storage={storage}", "--benchmark-compare=0042")
    assert nothing.returncode == 4 and "no saved run matches '0042'" in nothing.stderr, nothing.stderr
    assert "0001_baseline.json" in nothing.stderr  # what is there, to pick from

    (storage / "0002_broken.json").write_text('{"benchmarks": [')
    corrupt = _collect(pytester, f"--benchmark-storage={storage}", "--benchmark-compare")
    assert corrupt.returncode == 4, corrupt.stderr
    assert "0002_broken.json is not a pytest-benchmark saved run" in corrupt.stderr
    (storage / "0002_broken.json").unlink()

    old = json.loads((storage / "0001_baseline.json").read_text())
    for entry in old["benchmarks"]:
        entry["extra_info"]["schema"] = 2
    (storage / "0001_baseline.json").write_text(json.dumps(old))
    schema = _collect(pytester, f"--benchmark-storage={storage}", "--benchmark-compare")
    assert schema.returncode == 4 and "schema [2]" in schema.stderr and "--update-baselines" in schema.stderr
    for done in (missing, nothing, corrupt, schema):
        assert "Traceback" not in done.stderr


def test_a_storage_of_ones_own_is_compared_as_given(pytester, tmp_path):
    """With --benchmark-storage (or --benchmark-autosave) a compare reads that history, whatever the
    platform, and never redirects to the committed baselines, which a run does not write to."""
    shutil.copy(baselines.storage_file(COMMITTED, "phx"), tmp_path / "0007_mine.json")
    given = _collect(
        pytester, f"--benchmark-storage={tmp_path}", "--benchmark-compare", "--platform", "nowhere-1c"
    )
    assert given.returncode == 0, given.stderr
    saving = _collect(pytester, "--benchmark-compare", "--benchmark-autosave", "--platform", "nowhere-1c")
    assert "has no committed baseline" not in saving.stderr
    assert saving.returncode == 0 or ".benchmarks" in saving.stderr, saving.stderr
