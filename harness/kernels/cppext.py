"""Build and load the harness's C++ kernels with torch's extension loader, once per content of their
sources, flags and torch version."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

from harness.base import files
from harness.base.errors import UnsupportedError
from harness.weights import packaged

log = logging.getLogger(__name__)
_BUILT = "built.json"

# Headers every kernel source includes (the host's kind, ``host.h``; how a pass is shared out over
# threads, ``split.h``): part of every build.
HEADERS = tuple(Path(__file__).with_name(name) for name in ("host.h", "split.h"))

# The kernels' AVX2 paths are the baseline (AVX-512 functions carry their own target attribute);
# no contraction into fma, so every path runs the IEEE operations the source spells.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off"]


def compile_flags(includes: tuple[Path, ...] = ()) -> list[str]:
    """The compiler flags, with the digest of the files a source includes (the loader compares its
    flags and its sources, not what they include)."""
    if not includes:
        return list(CFLAGS)
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in includes)).hexdigest()[:16]
    return [*CFLAGS, f"-DASSISTED_GENERATION_INCLUDES=0x{digest}"]


def build_key(source: Path, includes: tuple[Path, ...] = ()) -> str:
    """What a build depends on: the source's and its includes' content, the flags and torch's version;
    not where a checkout keeps them (two checkouts of one commit share one build)."""
    blob = hashlib.sha256()
    for path in (source, *includes):
        blob.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    blob.update(" ".join(compile_flags(includes)).encode())
    return blob.hexdigest()[:16]


def build(name: str, source: Path, includes: tuple[Path, ...] = ()) -> ModuleType:
    """Compile ``source`` as module ``name`` into the cache (first use: about a minute on 2 cores).
    ``includes``: the files ``source`` includes (``HEADERS`` always), so that a change of theirs
    rebuilds it too.

    The build folder is named by ``build_key`` and compiles a copy of the sources kept inside it:
    the loader's ninja file names its source by path, so compiling a checkout's own file rebuilt the
    module whenever another checkout (or a moved one) had built it last."""
    from torch.utils import cpp_extension

    includes = (*includes, *(h for h in HEADERS if h not in includes))
    flags = compile_flags(includes)
    folder = (
        packaged.cache_root()
        / "kernels"
        / f"torch-{torch.__version__}"
        / f"{name}-{build_key(source, includes)}"
    )
    sources = folder / "src"
    sources.mkdir(parents=True, exist_ok=True)
    for path in (source, *includes):
        copy = sources / path.name
        data = path.read_bytes()
        if not copy.is_file() or copy.read_bytes() != data:
            files.atomic_write(copy, data)
    library = folder / f"{name}.so"
    _drop_if_damaged(library)
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(sources / source.name)],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=bool(os.environ.get("ASSISTED_GENERATION_VERBOSE_BUILD")),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        raise UnsupportedError(
            f"could not build {source.name} ({str(exc).splitlines()[0]}): the batch-invariant kernels need "
            "a C++ compiler (g++) and the `ninja` package; install them or use --target_kernels stock"
        ) from exc
    if not (folder / _BUILT).is_file() and library.is_file():
        files.atomic_write(
            folder / _BUILT, json.dumps({"files": files.record(folder, [library.name])}).encode()
        )
    return module


def _drop_if_damaged(library: Path) -> None:
    """Delete a built library that is not the one its build recorded (cut or overwritten since), so
    the loader links it again: ninja trusts any file newer than its sources, and loading a cut
    library ends the process with a bus error, past any error handling."""
    if not library.exists():
        return
    try:
        recorded = json.loads((library.parent / _BUILT).read_text(encoding="utf-8"))["files"]
        why = files.problem(library.parent, recorded)
    except (OSError, ValueError, KeyError, TypeError):
        why = "no record of its build"
    if why is not None:
        log.warning("kernel library %s is not usable (%s); linking it again", library, why)
        (library.parent / _BUILT).unlink(missing_ok=True)
        library.unlink()
