"""A pair's GGUF files as OpenVINO IR folders, which OpenVINO GenAI's ``LLMPipeline`` and
``draft_model`` load.

Why this route: optimum-intel, the usual exporter, pins transformers below this project's (an
environment of its own, a second torch, minutes of CI); OpenVINO GenAI reads a GGUF file itself and
saves the model it builds from the file's own blocks as IR (``enable_save_ov_model``). Its reader
takes F32/F16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks; a file holding others (the packaged draft's Q5_0) is
first rewritten with every block that is not F32 or Q8_0 requantized to Q8_0 by the ``gguf``
package's own quantizer (8-bit blocks of the dequantized 5-bit ones: the draft only proposes tokens
the target verifies, so this moves acceptance, never the output). The target's Q4_K/Q6_K blocks are
read as they are.

The conversion runs in a subprocess (``python -m harness.weights.openvino_ir SRC OUT``: its memory is
gone before decoding starts), into a temporary folder renamed into place once it holds the IR and a
COMPLETE marker recording every file's size and sha256, so an interrupted conversion never looks
finished. Cache layout: ``<cache>/openvino/<model>-<source fingerprint>-ov<version>/``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from harness.base import files
from harness.base.errors import ChecksumError, HarnessError
from harness.weights import packaged

MARKER = "COMPLETE"
_PARTIAL = ".partial-"
MODEL_FILES = ("openvino_model.xml", "openvino_model.bin")
# Block types OpenVINO GenAI's GGUF reader builds a model from (others fail inside it).
READABLE = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")


def openvino_version() -> str:
    try:
        return metadata.version("openvino-genai")
    except metadata.PackageNotFoundError:
        raise HarnessError(
            "--engine openvino needs OpenVINO GenAI: `pip install openvino-genai` (the set-up installs it)"
        ) from None


def ir_dir(gguf: Path, cache: Path | None = None) -> Path:
    """Where the IR of ``gguf`` goes: named by the file's size and time and the version of the
    reader that builds it (another version may build another graph), not by the model's name or the
    file's: the IR is made from the file alone, so a pair's file reached under another name (a hard
    link, a copy that kept its time, two bare files named for their roles) reuses the IR made once."""
    stat = gguf.stat()
    root = Path(cache if cache is not None else packaged.cache_root()) / "openvino"
    version = openvino_version().split("-")[0]
    return root / f"gguf-{stat.st_size}-{stat.st_mtime_ns}-ov{version}"


def is_built(folder: Path, *, verify: bool = False) -> bool:
    """A finished conversion: marker present and every recorded file intact (``files.problem``)."""
    try:
        record = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        return files.problem(folder, record["files"], verify=verify) is None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ir_folder(name: str, gguf: Path, cache: Path | None = None, *, verify: bool = False) -> Path:
    """The IR folder of ``gguf``, converting it once (one converter at a time per model)."""
    final = ir_dir(gguf, cache)
    files.build_once(
        final.parent / f".{final.name}.lock",
        lambda: is_built(final, verify=verify),
        lambda: _convert_locked(name, gguf, final),
    )
    if not is_built(final):  # pragma: no cover - a disk that lost the files
        raise ChecksumError(f"{final}: the conversion does not match its recorded sizes; delete it and rerun")
    return final


def _convert_locked(name: str, gguf: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)  # no valid marker: interrupted, or its files changed since
    for leftover in final.parent.glob(f"{final.name}{_PARTIAL}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=final.name + _PARTIAL))
    try:
        out = tmp / "ir"
        out.mkdir()
        print(f"converting {name} to OpenVINO IR, once (about 20-40 s)", file=sys.stderr)
        start = time.perf_counter()
        command = [sys.executable, "-m", "harness.weights.openvino_ir", str(gguf), str(out)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not all((out / f).is_file() for f in MODEL_FILES):
            raise HarnessError(
                f"converting {name} ({gguf}) to OpenVINO IR failed (exit {done.returncode}):\n"
                f"{(done.stderr or done.stdout)[-2000:]}\nCommand: {' '.join(command)}"
            )
        record = {
            "source": str(gguf),
            "openvino-genai": openvino_version(),
            "requantized": json.loads((out / "requantized.json").read_text(encoding="utf-8")),
            "seconds": round(time.perf_counter() - start, 1),
        }
        files.seal(out, final, MARKER, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def readable_copy(src: Path, dest: Path) -> dict[str, int]:
    """Write ``src`` to ``dest`` with every block OpenVINO's reader cannot read, and every other
    block that is not F32, requantized to Q8_0 (the same metadata, tokenizer included); returns how
    many tensors of each type were requantized."""
    import gguf
    from gguf.quants import dequantize, quantize

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dest, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    q8 = gguf.GGMLQuantizationType.Q8_0
    kept = (gguf.GGMLQuantizationType.F32, q8)
    requantized: dict[str, int] = {}
    tensors = []
    for tensor in reader.tensors:
        data, kind = tensor.data, tensor.tensor_type
        if kind not in kept:
            requantized[kind.name] = requantized.get(kind.name, 0) + 1
            data, kind = quantize(dequantize(tensor.data, tensor.tensor_type), q8), q8
        tensors.append(data)
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return requantized


def _block_types(path: Path) -> set[str]:
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def convert(src: Path, out: Path) -> None:
    """The subprocess's work: ``src`` (a GGUF file) as IR in ``out``, through OpenVINO GenAI's own
    reader, which saves what it built beside the file it read."""
    import openvino_genai

    requantized: dict[str, int] = {}
    staged = out / "model.gguf"
    if _block_types(src) - set(READABLE):
        requantized = readable_copy(src, staged)
    else:
        staged.symlink_to(src.resolve())
    openvino_genai.LLMPipeline(str(staged), "CPU", enable_save_ov_model=True)
    staged.unlink()
    (out / "requantized.json").write_text(json.dumps(requantized), encoding="utf-8")


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
