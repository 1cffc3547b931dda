"""The lock the set-up installs holds every dependency pyproject.toml names, at a version its range allows."""

import importlib.util
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _moved_module():
    spec = importlib.util.spec_from_file_location("moved", ROOT / "requirements" / "moved.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


moved = _moved_module()


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pip-tools"]["extra"]
    optional = project["optional-dependencies"]
    assert set(extras) == set(optional), "the lock must hold every extra: the set-up installs them all"
    lines = project["dependencies"] + [line for extra in extras for line in optional[extra]]
    lines += [ln for ln in (ROOT / "requirements" / "lock.in").read_text().splitlines() if ln[:1].isalpha()]
    return [Requirement(line) for line in lines]


def test_every_declared_dependency_is_locked_within_its_range():
    pins = moved.locked((ROOT / "requirements" / "lock.txt").read_text())
    assert len(pins) > 50
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements/lock.txt: refresh it (README, Set-up)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"locked {name}=={pins[name]} breaks {req}"
        )


def test_every_locked_distribution_carries_its_hash():
    text = (ROOT / "requirements" / "lock.txt").read_text()
    blocks = [b for b in text.split("\n") if b and b[0].isalpha()]
    assert blocks and all(b.endswith("\\") for b in blocks), "a pin without --hash lines"


def test_moved_names_what_differs_from_the_lock():
    pins = moved.locked("pytest==0.0.1 \\\n    --hash=sha256:ab\nno-such-dist-here==1.0 \\\n")
    assert pins == {"pytest": "0.0.1", "no-such-dist-here": "1.0"}
    lines = moved.moved(pins)
    assert lines[0] == "no-such-dist-here: locked 1.0, not installed"
    assert lines[1].startswith("pytest: locked 0.0.1, installed ")
