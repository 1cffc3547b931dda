"""Export a target to ONNX (KV cache, logits for every position), int4 by ONNX Runtime's quantizer.

The graph is written by onnxruntime-genai's model builder, run as a subprocess on the same Hugging
Face folder the torch backend loads. Why the builder and not ``torch.onnx.export`` or optimum:
it writes the decoder with ONNX Runtime's fused GroupQueryAttention and a past/present KV cache
directly from the weights (no tracing of transformers' cache classes), and quantizes the matmuls
with ``onnxruntime.quantization.matmul_nbits_quantizer`` (MatMulNBits); optimum-onnx 0.1.0 pins
transformers below this project's. A subprocess because the builder peaks at ~16 GB for a 1.5B
fp32 source and that memory should be gone before the benchmark starts.

Cache layout (beside the converted weights), valid only with its COMPLETE marker, written last:
    <cache>/onnx/<source>-<fingerprint>/<settings label>/model.onnx, model.onnx.data, COMPLETE
COMPLETE records the settings, the builder version, the source fingerprint and every file's sha256
and size (the graph, its weights, the engine's ``genai_config.json`` and the tokenizer files). The
folder is built next to its final place and renamed into it, so an interrupted export never looks
finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from harness.base import files
from harness.base.backends import OrtSettings
from harness.base.errors import ChecksumError, HarnessError
from harness.weights import packaged

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
_PARTIAL = ".partial-"
# Files under this size are fingerprinted by content, larger ones by name, size and mtime (hashing
# a 7 GB safetensors file on every load would cost more than the load).
_HASH_CONTENT_BELOW = 64 << 20
_MODEL_FILES = ("model.onnx", "model.onnx.data")


def source_fingerprint(hf_dir: Path) -> str:
    """Changes whenever the source folder's config or weights do, and only then.

    A file named after another file of the folder plus a suffix (``model.safetensors.q4k-...``, the
    k-quant blocks the kernels cache beside the weights they were made from, and its marker) is
    derived from that file, not read by the exporter: counting it would make a new export, and a new
    speculative folder, of unchanged weights each time a cache appears beside them."""
    h = hashlib.sha256()
    entries = sorted(hf_dir.iterdir())
    names = {f.name for f in entries}
    for f in entries:
        if f.suffix not in (".json", ".safetensors", ".bin") or f.name == MARKER:
            continue
        if any(f.name.startswith(other + ".") for other in names if other != f.name):
            continue
        st = f.stat()
        h.update(f.name.encode())
        if st.st_size < _HASH_CONTENT_BELOW:
            h.update(f.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def export_dir(name: str, hf_dir: Path, settings: OrtSettings, cache: Path | None = None) -> Path:
    root = Path(cache if cache is not None else packaged.cache_root()) / "onnx"
    return root / f"{name}-{source_fingerprint(hf_dir)[:16]}" / settings.slug


def is_exported(folder: Path, *, verify: bool = False) -> bool:
    """A finished export: marker present and every file of it intact (``files.problem``: sizes
    always, contents when a file was touched since it was written, all contents with ``verify``).
    A file the marker does not record (an export recorded before every file was) makes it
    unfinished: the engine reads ``genai_config.json`` and the tokenizer's files too."""
    try:
        record = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        present = {p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER}
        if not present <= set(record["files"]):
            return False
        return files.problem(folder, record["files"], verify=verify) is None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def builder_command(src: Path, out: Path, settings: OrtSettings, workdir: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(src),
        "-o",
        str(out),
        "-p",
        settings.precision,
        "-e",
        "cpu",
        "-c",
        str(workdir / "hf-cache"),
    ]
    if settings.precision == "int4":
        cmd += [
            "--extra_options",
            f"int4_block_size={settings.block_size}",
            f"int4_accuracy_level={settings.accuracy_level}",
        ]
    return cmd


def export(
    name: str, hf_dir: Path, settings: OrtSettings, cache: Path | None = None, *, verify: bool = False
) -> Path:
    """The exported folder for ``hf_dir`` at ``settings``, building it once."""
    final = export_dir(name, hf_dir, settings, cache)
    files.build_once(
        final.parent / ".lock",
        lambda: is_exported(final, verify=verify),
        lambda: _export_locked(name, hf_dir, settings, final),
    )
    # Sizes only: the sha256s in the marker were computed from these files a moment ago.
    if not is_exported(final):  # pragma: no cover - a disk that lost the files
        raise ChecksumError(f"{final}: the export does not match its recorded sizes; delete it and rerun")
    return final


def _export_locked(name: str, hf_dir: Path, settings: OrtSettings, final: Path) -> None:
    if final.exists():
        log.warning("%s has no valid %s marker (interrupted or stale); exporting again", final, MARKER)
        shutil.rmtree(final)
    for leftover in final.parent.glob(f"*{_PARTIAL}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=settings.slug + _PARTIAL))
    try:
        out = tmp / "model"
        cmd = builder_command(hf_dir, out, settings, tmp)
        log.info("exporting %s to ONNX (%s): %s", name, settings.label, " ".join(cmd))
        start = time.perf_counter()
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # The builder's own progress bars go to its captured output (shown if it fails); one line
        # here says why nothing else moves for a minute or two, once per source and settings.
        print(
            f"exporting {name} to ONNX ({settings.label}), once; a 1.5B model takes ~1.5 min", file=sys.stderr
        )
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0 or not all((out / f).is_file() for f in _MODEL_FILES):
            raise HarnessError(
                f"exporting {name} to ONNX failed (exit {done.returncode}); the builder said:\n"
                f"{done.stderr[-2000:] or done.stdout[-2000:]}\nCommand: {' '.join(cmd)}"
            )
        record = {
            "settings": settings.__dict__ | {"label": settings.label},
            "builder": f"onnxruntime-genai {metadata.version('onnxruntime-genai')}",
            "onnxruntime": metadata.version("onnxruntime"),
            "source": str(hf_dir),
            "source_fingerprint": source_fingerprint(hf_dir),
            "seconds": round(time.perf_counter() - start, 1),
        }
        files.seal(out, final, MARKER, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
