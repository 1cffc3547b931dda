"""Which device a model runs on: validate the user's choice before any weights load, then place it.

Only CPU is exercised on this project's machines. CUDA works where the torch build has it; "npu" is
an extension point for the seeds' AIE/NPU targets (AMD Ryzen AI), which needs a backend that does not
exist here, so it fails early with a message saying what would be needed.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from harness.base.errors import UnsupportedError

_CUDA = re.compile(r"^cuda(?::(\d+))?$")
_KNOWN = "'cpu', 'cuda', 'cuda:N' or 'npu'"


def _no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return (
            f"this torch build ({torch.__version__}) is the CPU-only build and has no CUDA support; "
            "install a CUDA build of torch on a machine with an NVIDIA GPU, or use device 'cpu'"
        )
    return (
        f"torch {torch.__version__} was built with CUDA {torch.version.cuda} but sees no usable GPU "
        "(no device, or no driver); check nvidia-smi and CUDA_VISIBLE_DEVICES, or use device 'cpu'"
    )


def check_device(name: str) -> torch.device:
    """Parse and validate a device name; raise UnsupportedError naming the problem and the fix.

    Pure check: touches no model, so it can run before any weights load."""
    text = name.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    match = _CUDA.match(text)
    if match:
        if not torch.cuda.is_available():
            raise UnsupportedError(f"Device {name!r} is not available: {_no_cuda_reason()}.")
        index = int(match.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise UnsupportedError(
                f"Device {name!r} does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}. Pick one of those."
            )
        return torch.device("cuda", index)
    if text == "npu" or text.startswith("npu:"):
        raise UnsupportedError(
            f"Device {name!r} is not available: no NPU backend is available on this machine. Running on "
            "an NPU (such as the AMD Ryzen AI 'AIE' target in the seed results) would need the vendor's "
            "runtime and torch extension installed, the NPU hardware, and a harness backend that places "
            "and quantizes models for it; none exists yet. Use device 'cpu'."
        )
    raise UnsupportedError(f"Unknown device {name!r}. Use {_KNOWN} (available here: {available_devices()}).")


def available_devices() -> list[str]:
    """Device names that `check_device` accepts on this machine, e.g. ['cpu'] or ['cpu', 'cuda:0']."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return devices


def device_of(model: object) -> torch.device:
    """Where ``model``'s weights are: its first parameter's device; the CPU for a model without torch
    parameters (an ONNX Runtime target, an engine's stand-in for one)."""
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return first.device if first is not None else torch.device("cpu")


def _cpu_only_modules(model: nn.Module) -> list[str]:
    # Modules whose kernels exist only on CPU. Matched by class name, so that this module does not
    # depend on harness.settings.precision (which imports the quantized-linear classes).
    cpu_only = {"Int4WeightOnlyLinear", "Int8WeightOnlyLinear"}
    names = []
    for name, module in model.named_modules():
        cls = type(module)
        quantized_linear = cls.__name__ == "Linear" and cls.__module__.startswith("torch.ao.nn.quantized")
        if cls.__name__ in cpu_only or quantized_linear:
            names.append(name or type(module).__name__)
    return names


def place(model: nn.Module, device: str | torch.device) -> nn.Module:
    """Move `model` to `device` (validated by `check_device`) and return it.

    Refuses to move CPU-only quantized layers off the CPU, where they would fail at the first forward."""
    target = check_device(str(device))
    if target.type != "cpu":
        cpu_only = _cpu_only_modules(model)
        if cpu_only:
            raise UnsupportedError(
                f"The model has {len(cpu_only)} CPU-only quantized layer(s) (e.g. {cpu_only[0]}) and cannot "
                f"run on {target}. Use a fp32 or bf16 precision on {target.type}, or run on cpu."
            )
    return model.to(target)
