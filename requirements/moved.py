"""Which installed distributions differ from requirements/lock.txt: what moved in an environment that
resolved pyproject.toml's ranges afresh (``tox -e newest``), printed before its tests run."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parent / "lock.txt"


def locked(text: str) -> dict[str, str]:
    """``name -> version`` for every ``name==version`` line of a pip-compile lock."""
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", text, flags=re.MULTILINE)
    return {canonicalize_name(name): version for name, version in pins}


def moved(pins: dict[str, str]) -> list[str]:
    lines = []
    for name, version in sorted(pins.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            lines.append(f"{name}: locked {version}, not installed")
            continue
        if installed != version:
            lines.append(f"{name}: locked {version}, installed {installed}")
    return lines


def main() -> int:
    lines = moved(locked(LOCK.read_text(encoding="utf-8")))
    print(f"{len(lines)} distribution(s) differ from {LOCK.name}" + (":" if lines else ""))
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
