"""A GGUF file as a plain float32 Hugging Face folder, checked against the file's own model.

transformers dequantizes GGUF files on load but will not save such a model, so the state dict,
config and generation config are written here directly, then loaded back and required to give
bit-identical logits.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from harness.base.errors import HarnessError

log = logging.getLogger(__name__)


def build_hf_folder(gguf: Path, dest: Path) -> dict[str, Any]:
    """Dequantize a GGUF with transformers and write it as a plain fp32 safetensors folder in `dest`.

    `save_pretrained` refuses GGUF-loaded models, so the state dict, config and generation config are
    written directly. The folder is then loaded back and must give no missing/unexpected keys and
    bit-identical logits to the GGUF-loaded model on a short prompt (same dequantized tensors).
    """
    import gc

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with torch.inference_mode():
        t0 = time.perf_counter()
        log.info("loading tokenizer from %s", gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(dest)
        log.info("dequantizing %s (about a minute per model on 2 cores)", gguf.name)
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        src.eval()
        gguf_load_s = time.perf_counter() - t0

        probe = tokenizer("def fibonacci(n):\n    return", return_tensors="pt")["input_ids"]
        reference = src(probe).logits

        state = _dedup_tied(src)
        save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
        config = src.config.to_dict()
        # The GGUF loader marks the config as quantized; the dequantized folder is plain fp32.
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)  # the temp folder it was loaded from; meaningless later
        config["dtype"] = "float32"
        config["architectures"] = [type(src).__name__]  # the GGUF loader leaves it null
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        if src.generation_config is not None:
            src.generation_config.save_pretrained(dest)
        n_params = sum(t.numel() for t in state.values())
        del state, src
        gc.collect()

        t1 = time.perf_counter()
        back, info = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32, output_loading_info=True)
        reload_s = time.perf_counter() - t1
        problems = {k: v for k, v in info.items() if v}
        if problems:
            raise HarnessError(
                f"converted folder {dest} does not load cleanly: {problems}; please report this"
            )
        back.eval()
        got = back(probe).logits
        max_diff = float((got - reference).abs().max())
        if not torch.equal(got, reference):
            raise HarnessError(
                f"converted folder {dest} gives different logits from the GGUF (max |diff| {max_diff:.3g}); "
                "please report this with the transformers and safetensors versions"
            )
    return {
        "gguf_load_seconds": round(gguf_load_s, 2),
        "reload_seconds": round(reload_s, 2),
        "parameters_saved": n_params,
        "tied_word_embeddings": bool(getattr(back.config, "tie_word_embeddings", False)),
        "logits_max_abs_diff": max_diff,
        "probe_tokens": int(probe.shape[1]),
    }


def _dedup_tied(model: Any) -> dict[str, Any]:
    """State dict without the tied copies (safetensors rejects shared storage; the model re-ties)."""
    state = model.state_dict()
    tied = model.get_output_embeddings() is not None and model.config.tie_word_embeddings
    out: dict[str, Any] = {}
    seen: dict[tuple[int, int], str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            if not tied:
                raise HarnessError(f"{name} shares storage with {seen[key]} but the config does not tie them")
            continue  # dropped: lm_head.weight is re-tied to the embedding on load
        seen[key] = name
        out[name] = tensor.contiguous()
    return out
