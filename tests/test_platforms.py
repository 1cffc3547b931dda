"""Platform slugs key baselines: machines that run the harness's kernels differently must differ."""

from __future__ import annotations

import pytest

from harness.base import platforms


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


def test_cpu_generation_is_recorded_not_in_the_slug(monkeypatch, tmp_path):
    # Two generations of "AMD EPYC" share a slug (and baselines; the speedup gate adjusts for their
    # forward costs), but each record and the benchmark summary say which one it was.
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: avx2 fma\n"
    )
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda f, *a, **k: real_open(info if f == "/proc/cpuinfo" else f, *a, **k)
    )
    monkeypatch.setattr(platforms, "_accelerator", lambda: "none")
    platforms.detect.cache_clear()
    try:
        found = platforms.detect()
    finally:
        platforms.detect.cache_clear()
    assert found.cpu == "AMD EPYC" and found.cpu_id == "family 26 model 2 stepping 1"
    assert found.name.startswith("amd-epyc-") and "26" not in found.name
    assert "family 26 model 2" in found.describe() and found.to_dict()["cpu_id"] == found.cpu_id
