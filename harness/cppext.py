"""Build and load the harness's C++ kernels with torch's extension loader, once per torch version."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch

from harness import packaged
from harness.errors import UnsupportedError

# The kernels' AVX2 paths are the baseline (AVX-512 functions carry their own target attribute);
# no contraction into fma, so every path runs the IEEE operations the source spells.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off"]


def build(name: str, source: Path) -> ModuleType:
    """Compile ``source`` as module ``name`` into the cache (first use: about a minute on 2 cores)."""
    from torch.utils import cpp_extension

    # One folder per module: the loader writes a build.ninja of fixed name into it.
    folder = packaged.cache_root() / "kernels" / f"torch-{torch.__version__}" / name
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(source)],
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=bool(os.environ.get("ASSISTED_GENERATION_VERBOSE_BUILD")),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        raise UnsupportedError(
            f"could not build {source.name} ({str(exc).splitlines()[0]}): the batch-invariant kernels need "
            "a C++ compiler (g++) and the `ninja` package; install them or use --target_kernels stock"
        ) from exc
