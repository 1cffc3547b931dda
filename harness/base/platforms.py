"""Which machine a result was measured on, so baselines and tables say where they come from."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class PlatformInfo:
    name: str  # slug used for baselines/<name>/ and results/<name>/
    cpu: str
    cores: int
    accelerator: str
    system: str
    # Family/model/stepping: VMs that all say "AMD EPYC" can be different generations underneath, and
    # the generation moves the speedup (recorded so a baseline says which one it was measured on).
    cpu_id: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        cpu = f"{self.cpu}, {self.cpu_id}" if self.cpu_id else self.cpu
        accel = "" if self.accelerator == "none" else f", {self.accelerator}"
        return f"{self.name} ({cpu}, {self.cores} cores{accel}; {self.system})"


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in /proc/cpuinfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_id() -> str:
    parts = [
        (label, _cpuinfo(field))
        for label, field in (("family", "cpu family"), ("model", "model\t"), ("stepping", "stepping"))
    ]
    return " ".join(f"{label} {value}" for label, value in parts if value)


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux), or None where /proc/cpuinfo cannot tell."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


# Flags that pick a faster kernel path in harness.kernels.invariant (int8 x int8 products, 64 per
# instruction): two machines of the same model name and core count with and without them run the
# same configuration at different speeds, so they need separate baselines.
_AVX512_VNNI = {"avx512f", "avx512bw", "avx512_vnni"}


def _accelerator() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - an unusable torch build just means "no accelerator"
        pass
    return "none"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@functools.lru_cache(maxsize=1)
def detect() -> PlatformInfo:
    """Describe this machine; the slug keys baselines, so it must be stable across runs."""
    cpu = _cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    accel = _accelerator()
    short_cpu = re.sub(r"\(R\)|\(TM\)|CPU|Processor|@.*$", "", cpu)
    isa = "-avx512" if _AVX512_VNNI <= (cpu_flags() or set()) else ""
    name = f"{slug(short_cpu)}-{cores}c{isa}" + ("" if accel == "none" else f"-{slug(accel)}")
    return PlatformInfo(
        name=name, cpu=cpu, cores=cores, accelerator=accel, system=platform.platform(), cpu_id=_cpu_id()
    )


def library_versions() -> dict[str, str]:
    """Versions that change speed or output; recorded with every row and baseline."""
    import torch

    # The running build's own string: its local tag (+cpu, +cu130) says which build measured, and a
    # wheel's metadata can leave it out (a CUDA build's read "2.11.0" beside "2.11.0+cu130").
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in (
        "transformers",
        "tokenizers",
        "gguf",
        "onnxruntime",
        "pytest-benchmark",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


@functools.lru_cache(maxsize=1)
def host_id() -> str:
    """This machine, as a short stable hash (host name and machine id): rows carry it, so a run
    resumes only rows this host measured, never another host's that share a platform slug."""
    try:
        machine = Path("/etc/machine-id").read_text(encoding="utf-8").strip()
    except OSError:
        machine = ""
    return hashlib.sha256(f"{platform.node()}|{machine}".encode()).hexdigest()[:10]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The harness's own code (its Python and C++ sources) as a short hash: a run resumes only rows
    the same code measured."""
    root = Path(__file__).resolve().parents[1]  # the harness package
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.cpp")]):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
