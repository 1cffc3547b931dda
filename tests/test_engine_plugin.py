"""An engine from another package: the worked example in ``examples/`` installed into an
environment of its own, then run through the three suites by name, with nothing in the harness
naming it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.decoding import engines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torch-loop-engine"


def _install(tmp_path: Path) -> dict[str, str]:
    """The example installed as pip installs any package (its metadata and entry point), into a
    folder of its own; the environment that sees it."""
    source, site = tmp_path / "source", tmp_path / "site"
    shutil.copytree(EXAMPLE, source)  # the build's by-products stay out of the checkout
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # Not this run's xdist worker settings: the suites it starts run as a user's would.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))}


def test_an_engine_installed_from_another_package_runs_the_three_suites_tiny_tiers(tmp_path: Path) -> None:
    assert "torch-loop" not in engines.names()  # not the harness's: only the installed package adds it
    env = _install(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "perf/test_decode.py",
         "perf/test_benchmark.py", "perf/test_humaneval.py", "-m", "engine", "-k", "tiny",
         "--engines", "torch-loop"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for test in (
        "perf/test_decode.py::test_engine_tier[tiny-qwen2-torch_loop] PASSED",
        "perf/test_benchmark.py::test_benchmark_machinery_tiny_engine[tiny-qwen2-torch_loop] PASSED",
        "perf/test_humaneval.py::test_humaneval_machinery_tiny_engine[tiny-qwen2-torch_loop] PASSED",
    ):
        assert test in done.stdout, done.stdout[-4000:]
    assert "engines: torch-loop" in done.stdout


def test_the_cli_offers_an_installed_engine_and_refuses_one_that_is_not(tmp_path: Path) -> None:
    env = _install(tmp_path)
    command = [sys.executable, "assisted_generation.py", "--model_name", "tiny-qwen2", "--compare",
               "--limit", "1", "--max_new_tokens", "8"]  # fmt: skip
    done = subprocess.run(
        [*command, "--engine", "torch-loop"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--engine torch-loop" in done.stdout and "yes" in done.stdout  # its output the plain one's
    refused = subprocess.run([*command, "--engine", "torch-loop"], cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "invalid choice: 'torch-loop'" in refused.stderr
    assert "Traceback" not in refused.stderr
