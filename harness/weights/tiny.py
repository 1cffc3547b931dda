"""Tiny random stand-ins, one per architecture family, built from a config with a fixed seed.

They exercise every code path the real 7B pairs take (the family's attention, cache, vocab
reconciliation) in seconds. Each tiny draft is a smaller config of the same family whose weights are
the target's first layers plus a little noise: a random-weight draft would never agree with a
random-weight target, and a draft that never agrees cannot exercise acceptance.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from harness.base.errors import HarnessError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
# Long enough for the benchmark task's 2048-token prompts plus 256 new tokens.
MAX_POSITIONS = 4096

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyRecipe:
    family: str
    vocab_size: int
    draft_vocab_size: int
    hidden: int = 64
    layers: int = 4
    draft_layers: int = 2
    heads: int = 4
    seed: int = 0
    # Std of the random weights. Larger than HF's 0.02 so logits are peaked: near-ties (where
    # batched and one-token arithmetic may legitimately pick different argmaxes) become rare.
    init_std: float = 0.2
    # The target's layers past the draft's depth write into the residual stream scaled by this:
    # it sets how far the target departs from its shallow draft, hence the acceptance rate.
    tail_scale: float = 0.15
    # Relative noise added to the copied draft weights.
    draft_noise: float = 0.0


TINY_RECIPES: dict[str, TinyRecipe] = {
    "tiny-opt": TinyRecipe("opt", vocab_size=512, draft_vocab_size=512, seed=11),
    "tiny-llama": TinyRecipe("llama", vocab_size=512, draft_vocab_size=512, seed=12),
    # CodeLlama's 32016-token vocab against a 32000-token Llama draft, as the seeds' pair.
    "tiny-codellama": TinyRecipe("codellama", vocab_size=32016, draft_vocab_size=32000, seed=13),
    "tiny-qwen2": TinyRecipe("qwen2", vocab_size=512, draft_vocab_size=512, seed=14),
}


def _config(recipe: TinyRecipe, vocab: int, layers: int) -> PretrainedConfig:
    common = dict(vocab_size=vocab, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    if recipe.family == "opt":
        return OPTConfig(
            hidden_size=recipe.hidden,
            ffn_dim=recipe.hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=recipe.heads,
            word_embed_proj_dim=recipe.hidden,
            max_position_embeddings=MAX_POSITIONS,
            init_std=recipe.init_std,
            **common,
        )
    if recipe.family in ("llama", "codellama"):
        return LlamaConfig(
            hidden_size=recipe.hidden,
            intermediate_size=recipe.hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=recipe.heads,
            num_key_value_heads=recipe.heads // 2,
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=recipe.init_std,
            rope_theta=1_000_000.0 if recipe.family == "codellama" else 10_000.0,
            **common,
        )
    if recipe.family == "qwen2":
        return Qwen2Config(
            hidden_size=recipe.hidden,
            intermediate_size=recipe.hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=recipe.heads,
            num_key_value_heads=recipe.heads // 2,
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=recipe.init_std,
            tie_word_embeddings=True,
            **common,
        )
    raise ValueError(f"no tiny recipe for family {recipe.family!r}")


_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "opt": OPTForCausalLM,
    "llama": LlamaForCausalLM,
    "codellama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}


def _clean_generation_config(model: PreTrainedModel) -> None:
    # Random models ship no generation defaults; make that explicit so nothing is inherited.
    # No eos: see harness.pairs.models._pin_generation_config (the runner passes it per call).
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, pad_token_id=PAD_ID)


_OUTPUT_PROJECTIONS = re.compile(r"layers\.(\d+)\.(self_attn\.(o_proj|out_proj)|mlp\.down_proj|fc2)\.weight$")


def _scale_tail_layers(model: PreTrainedModel, recipe: TinyRecipe) -> None:
    with torch.no_grad():
        for key, param in model.named_parameters():
            match = _OUTPUT_PROJECTIONS.search(key)
            if match and int(match.group(1)) >= recipe.draft_layers:
                param.mul_(recipe.tail_scale)


def build_target(name: str | TinyRecipe) -> PreTrainedModel:
    recipe = name if isinstance(name, TinyRecipe) else TINY_RECIPES[name]
    with torch.random.fork_rng():
        torch.manual_seed(recipe.seed)
        cls = _MODEL_CLASSES[recipe.family]
        model = cls(_config(recipe, recipe.vocab_size, recipe.layers))
        _scale_tail_layers(model, recipe)
    model.eval()
    _clean_generation_config(model)
    return model


def build_draft(name: str | TinyRecipe, target: PreTrainedModel | None = None) -> PreTrainedModel:
    """A shallower model of the same family sharing the target's first layers, plus noise."""
    recipe = name if isinstance(name, TinyRecipe) else TINY_RECIPES[name]
    target = target if target is not None else build_target(name)
    with torch.random.fork_rng():
        torch.manual_seed(recipe.seed + 1000)
        cls = _MODEL_CLASSES[recipe.family]
        draft = cls(_config(recipe, recipe.draft_vocab_size, recipe.draft_layers))
        target_state = target.state_dict()
        new_state = {}
        for key, value in draft.state_dict().items():
            source = target_state[key]
            if source.shape != value.shape:  # vocab-sized rows: the draft keeps the first rows
                source = source[: value.shape[0]]
            if source.is_floating_point() and source.dim() >= 2:
                source = source + recipe.draft_noise * source.std() * torch.randn_like(source)
            new_state[key] = source.clone()
        draft.load_state_dict(new_state)
    draft.eval()
    _clean_generation_config(draft)
    return draft


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer made offline: 3 specials + 256 byte tokens, no merges.

    Hand-made because no tokenizer can be downloaded here; `tokenizers` supplies the byte-level
    machinery, so only the vocabulary is ours. Ids past 258 (the tiny models' larger vocab) decode
    to nothing, which is what a tokenizer does for ids it does not know.
    """
    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def saved_folder(
    name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, root: str | None = None
) -> Path:
    """The tiny model as a Hugging Face folder, for tools that read one (the ONNX exporter).

    Named by its content, so an unchanged recipe reuses the folder and its export; written beside
    its final place and renamed, so concurrent test workers never see half a folder.
    """
    from harness.weights import onnx_export, packaged

    root = Path(root) if root is not None else packaged.cache_root() / "tiny-hf"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f"{name}.partial-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    fingerprint = onnx_export.source_fingerprint(tmp)
    final = root / f"{name}-{fingerprint[:16]}"
    try:
        os.replace(tmp, final)
    except OSError:  # a folder of that name exists: another process saved the same content first...
        if onnx_export.source_fingerprint(final) != fingerprint:
            # ...or it was damaged since (its name says what it held): replace it, never export it.
            log.warning("%s no longer holds what its name says; saving it again", final)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _rope_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    # transformers' Llama rotates the two halves of a head; llama.cpp's "llama" rope rotates
    # neighbouring pairs: each head's rows reordered so both compute the same product.
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def gguf_file(model: PreTrainedModel, path: str | os.PathLike[str]) -> Path:
    """A tiny Llama model as a GGUF file (fp32 weights, the tiny byte tokenizer's first tokens as
    its vocabulary), for the engines that read GGUF: llama.cpp's server decodes it as transformers
    does (the same greedy tokens, log-probabilities within fp32 rounding).

    Written here because llama.cpp's own converter (``convert_hf_to_gguf.py``) ships in its source
    tree, not in a package; the ``gguf`` package writes the file and names the tensors, and only
    llama.cpp's rope order is ours."""
    import gguf

    config = model.config
    if config.model_type != "llama":
        raise HarnessError(f"a tiny GGUF is written for Llama models, not {config.model_type!r}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    by_id = {i: t for t, i in build_tokenizer().get_vocab().items()}
    tokens = [by_id[i] for i in range(config.vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    specials = (PAD_ID, BOS_ID, EOS_ID)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))]
    )
    # llama.cpp refuses a BPE vocabulary without merges; one merge of two byte tokens changes nothing
    # for token ids in and out.
    writer.add_token_merges([f"{tokens[3]} {tokens[4]}"])
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for key, weight in model.state_dict().items():
        weight = weight.detach().float()
        if key.endswith("q_proj.weight"):
            weight = _rope_interleaved(weight, config.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            weight = _rope_interleaved(weight, config.num_key_value_heads)
        writer.add_tensor(names.get_name(key, try_suffixes=(".weight",)), weight.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
