"""Platform slugs key baselines: machines that run the harness's kernels differently must differ."""

from __future__ import annotations

import pytest

from harness import platforms


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        ({"avx2", "fma"}, "amd-epyc-2c"),
        ({"avx2", "fma", "avx512f", "avx512bw"}, "amd-epyc-2c"),  # AVX-512 without VNNI: the AVX2 path
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"}, "amd-epyc-2c-avx512"),
        (None, "amd-epyc-2c"),  # flags unknown (not Linux)
    ],
)
def test_slug_names_the_kernel_path(monkeypatch, flags, name):
    monkeypatch.setattr(platforms, "_cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(platforms, "cpu_flags", lambda: flags)
    monkeypatch.setattr(platforms, "_accelerator", lambda: "none")
    monkeypatch.setattr(platforms.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    platforms.detect.cache_clear()  # detect() is cached per process
    try:
        assert platforms.detect().name == name
    finally:
        platforms.detect.cache_clear()
