"""Writing files readers may be looking at, and naming them."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def file_name(text: str) -> str:
    """``text`` safe as one path component: model names can hold "/" (hub ids), kept readable."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return cleaned or "unknown"


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    readers never see a half-written table, image or baseline, and a killed run leaves the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; published files should be readable like any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _sha256(path: Path) -> str:
    import hashlib

    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def record(folder: str | os.PathLike[str], names: list[str]) -> dict[str, dict[str, int | str]]:
    """What ``problem`` later checks each named file of ``folder`` against: size, modification
    time and sha256, taken now (when the files were just written and are known good)."""
    out: dict[str, dict[str, int | str]] = {}
    for name in names:
        path = Path(folder) / name
        stat = path.stat()
        out[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(path)}
    return out


def problem(folder: str | os.PathLike[str], recorded: dict[str, Any], *, verify: bool = False) -> str | None:
    """Why ``folder``'s files are not the ones ``recorded`` (``record``), or None when they are.

    Sizes are checked always; contents (sha256) when a file's modification time is not the recorded
    one (an overwrite of the same size moves it) or when ``verify`` asks. A record holding only a
    size per file (older caches) is checked by size alone."""
    for name, rec in recorded.items():
        path = Path(folder) / name
        try:
            stat = path.stat()
        except OSError:
            return f"{path} is missing"
        size = rec if isinstance(rec, int) else rec.get("size")
        if stat.st_size != size:
            return f"{path} is {stat.st_size} bytes, recorded {size}"
        if isinstance(rec, dict) and "sha256" in rec:
            # A record without a time (older caches) is checked by content only when verifying.
            moved = "mtime_ns" in rec and stat.st_mtime_ns != rec["mtime_ns"]
            if (verify or moved) and _sha256(path) != rec["sha256"]:
                return f"{path}: content changed since it was written (sha256 differs)"
    return None


def seal(
    out: str | os.PathLike[str], final: str | os.PathLike[str], marker: str, info: dict[str, Any]
) -> None:
    """Finish a folder built beside its final place: ``marker`` written last (``info`` and every
    file's record), then the folder renamed into ``final``; a reader that finds the marker finds
    every file whole, and an interrupted build never looks finished."""
    import json

    out = Path(out)
    info = {**info, "files": record(out, sorted(p.name for p in out.iterdir() if p.is_file()))}
    (out / marker).write_text(json.dumps(info, indent=2), encoding="utf-8")
    os.replace(out, final)


def build_once(lock: str | os.PathLike[str], done: Callable[[], bool], build: Callable[[], None]) -> None:
    """Run ``build`` unless ``done()``, one process at a time per ``lock`` file: pytest-xdist
    workers and two shells wait for the one building, then find it done (checked again once the
    lock is held). Holding the lock also makes a killed build's leftovers safe to delete."""
    if done():
        return
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if not done():
                build()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
