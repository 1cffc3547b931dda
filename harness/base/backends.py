"""Which runtime computes the target: torch (the harness's own kernels or torch's) or ONNX Runtime.

The seam is small on purpose: a backend name, an execution provider, and for ONNX Runtime the
settings its exporter and quantizer take. Everything is checked here, before any weights load, so a
typo or a provider this machine lacks costs milliseconds and says what is available instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.base.errors import HarnessError, UnsupportedError

BACKENDS = ("torch", "onnxruntime")
DEFAULT_PROVIDER = "CPUExecutionProvider"
# Precisions of an exported target: fp32 (no quantization: the reference the int4 export is held
# against) and int4 (every MatMul quantized by ONNX Runtime's MatMulNBits quantizer).
ORT_PRECISIONS = ("int4", "fp32")
# The target precision of a model given as an export already made (the model builder's output folder):
# run as it was made, whatever settings made it.
EXPORT_LABEL = "ort-export"
# MatMulNBits accuracy levels: the type activations are computed in (ONNX Runtime's contrib op doc).
ACCURACY_LEVELS = {0: "unset", 1: "fp32", 2: "fp16", 3: "bf16", 4: "int8"}
# Architectures onnxruntime-genai's model builder writes with a KV cache, by harness family.
ORT_FAMILIES = ("qwen2", "llama", "codellama")


def ort_near_tie_tolerance(label: str) -> float:
    """How near a tie a flip of an ONNX Runtime target (its precision ``label``) may be. Third-party
    kernels: MLAS picks other blockings for M = 1 and M = K+1. fp32: a few ulps (measured ~1e-5 on
    the 1.5B); int4 with int8 activations (accuracy level 4): each block's activation scale is shared
    by the block, and the one-token and batched paths accumulate the blocks differently, measured up
    to 0.2 logits apart on one row; bf16's allowance, 0.5."""
    return 1e-3 if label == "ort-fp32" else 0.5


@dataclass(frozen=True)
class OrtSettings:
    """How the ONNX Runtime target is exported and run; all of it is recorded with every result."""

    precision: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    provider: str = DEFAULT_PROVIDER

    @property
    def label(self) -> str:
        """The target precision as rows, tables and baseline keys carry it (settings included, so
        two exports with other block sizes never share a baseline)."""
        if self.precision == "fp32":
            return "ort-fp32"
        return f"ort-int4-b{self.block_size}-a{ACCURACY_LEVELS[self.accuracy_level]}"

    @property
    def slug(self) -> str:
        """Folder name of the export (provider-independent: one export serves every provider)."""
        return self.label

    @classmethod
    def from_label(cls, label: str, provider: str = DEFAULT_PROVIDER) -> OrtSettings:
        """Inverse of ``label`` (rows keep the label; a reproduce command needs the flags)."""
        if label == "ort-fp32":
            return cls("fp32", provider=provider)
        parts = label.split("-")  # ort-int4-b<block>-a<activations>
        if len(parts) != 4 or parts[:2] != ["ort", "int4"]:
            raise HarnessError(f"{label!r} is not an ONNX Runtime target precision label")
        level = {v: k for k, v in ACCURACY_LEVELS.items()}[parts[3][1:]]
        return cls("int4", int(parts[2][1:]), level, provider)

    def validate(self) -> OrtSettings:
        if self.precision not in ORT_PRECISIONS:
            raise HarnessError(
                f"--target_precision {self.precision!r} is not offered with --target_backend onnxruntime; "
                f"choose one of {', '.join(ORT_PRECISIONS)}"
            )
        if self.block_size not in (16, 32, 64, 128, 256):
            raise HarnessError(
                f"--ort_block_size {self.block_size} is not one MatMulNBits takes; use 16, 32, 64, 128 or 256"
            )
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise HarnessError(
                f"--ort_accuracy_level {self.accuracy_level} is unknown; choose 0-4 "
                f"({', '.join(f'{k}={v}' for k, v in ACCURACY_LEVELS.items())})"
            )
        check_provider(self.provider)
        return self


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise HarnessError(f"unknown --target_backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "onnxruntime":
        _import_onnxruntime()
    return name


def available_providers() -> list[str]:
    return list(_import_onnxruntime().get_available_providers())


def check_provider(provider: str) -> str:
    """``provider`` if this ONNX Runtime build offers it; otherwise an error listing those it does."""
    available = available_providers()
    if provider not in available:
        raise UnsupportedError(
            f"execution provider {provider!r} is not available in this ONNX Runtime build "
            f"(onnxruntime {_import_onnxruntime().__version__}); available here: {', '.join(available)}. "
            "Another provider needs its own onnxruntime package (onnxruntime-gpu, onnxruntime-directml, "
            "Ryzen AI's onnxruntime-vitisai) and its hardware."
        )
    return provider


def check_family(family: str, pair: str) -> None:
    if family not in ORT_FAMILIES:
        raise UnsupportedError(
            f"{pair}: the ONNX exporter (onnxruntime-genai's model builder) does not write the "
            f"{family!r} architecture this harness registers; --target_backend onnxruntime covers "
            f"{', '.join(ORT_FAMILIES)}"
        )


def _import_onnxruntime():  # noqa: ANN202 (the module)
    try:
        import onnxruntime
    except ImportError as e:  # pragma: no cover - a broken install
        raise UnsupportedError(
            f"--target_backend onnxruntime needs the onnxruntime package ({e}): "
            'pip install "assisted-generation-harness[onnxruntime]", or run the README set-up'
        ) from None
    return onnxruntime
