"""An ONNX Runtime session that transformers' ``generate`` drives like any causal LM.

Why an adapter instead of the harness's own decoding loop: every suite already runs through
``generate`` (plain, assisted with its acceptance rule and K schedules, prompt lookup, sampling),
and the timing hooks sit on a module's forward. A ``PreTrainedModel`` whose forward runs the
session, and whose KV cache is transformers' own ``DynamicCache`` (which assisted decoding crops
after each rejection), gets all of that unchanged: the equivalence suites then test the ONNX
Runtime target with exactly the machinery they test the torch one with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from harness.base.backends import OrtSettings, _import_onnxruntime


class OrtCausalLM(PreTrainedModel, GenerationMixin):
    """Target logits from an exported decoder (inputs: ids, attention mask, past key/values per
    layer; outputs: logits for every position and the present key/values)."""

    main_input_name = "input_ids"
    _supports_cache_class = True
    base_model_prefix = "ort"

    def __init__(self, config: Any, session: Any, settings: OrtSettings, folder: Path, source: Path) -> None:
        super().__init__(config)
        self.session = session
        self.settings = settings
        self.folder = folder  # the export
        self.source = source  # the Hugging Face folder it was exported from (a "partial" draft reads it)
        inputs = {i.name: i for i in session.get_inputs()}
        self.num_layers = sum(1 for n in inputs if n.startswith("past_key_values.") and n.endswith(".key"))
        kv = inputs["past_key_values.0.key"].shape  # [batch, kv_heads, past, head_dim]
        self._kv_heads = int(kv[1])
        heads = config.num_attention_heads
        self._head_dim = int(kv[3]) if isinstance(kv[3], int) else config.hidden_size // heads
        self._outputs = [o.name for o in session.get_outputs()]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # the session's inputs and outputs live in host memory

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_output_embeddings(self) -> None:
        return None  # the output layer is inside the graph

    def __deepcopy__(self, memo: dict) -> OrtCausalLM:
        # A second model over the same session: sessions keep no per-sequence state (the cache is
        # passed in), so a "self" draft needs no second copy of the weights.
        twin = OrtCausalLM(self.config, self.session, self.settings, self.folder, self.source)
        twin.generation_config = self.generation_config
        return twin

    def _past(self, cache: DynamicCache, layer: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
        if cache.get_seq_length() == 0:
            empty = np.zeros((batch, self._kv_heads, 0, self._head_dim), dtype=np.float32)
            return empty, empty
        lay = cache.layers[layer]
        # After a crop the cache holds views; the session needs contiguous buffers.
        return np.ascontiguousarray(lay.keys.numpy()), np.ascontiguousarray(lay.values.numpy())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: DynamicCache | None = None,
        use_cache: bool = True,  # noqa: ARG002 (the graph always returns the present cache)
        **kwargs: Any,  # noqa: ARG002 (positions come from the mask inside the graph)
    ) -> CausalLMOutputWithPast:
        cache = past_key_values if past_key_values is not None else DynamicCache()
        batch, new = input_ids.shape
        past_len = cache.get_seq_length()
        if attention_mask is None:
            attention_mask = torch.ones(batch, past_len + new, dtype=torch.long)
        feed = {
            "input_ids": input_ids.numpy().astype(np.int64, copy=False),
            "attention_mask": attention_mask.numpy().astype(np.int64, copy=False),
        }
        for i in range(self.num_layers):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = self._past(cache, i, batch)
        out = dict(zip(self._outputs, self.session.run(None, feed), strict=True))
        for i in range(self.num_layers):
            k = torch.from_numpy(out[f"present.{i}.key"])
            v = torch.from_numpy(out[f"present.{i}.value"])
            if past_len == 0:
                cache.update(k, v, i)  # the first call lets the cache set its layers up
            else:
                # The graph returns past + new already concatenated (a fresh buffer): taking it as
                # the layer's state saves update()'s second concatenation, a full copy of the cache
                # per layer and forward.
                layer = cache.layers[i]
                layer.keys, layer.values = k, v
        return CausalLMOutputWithPast(logits=torch.from_numpy(out["logits"]), past_key_values=cache)


def session_options(threads: int | None = None) -> Any:
    ort = _import_onnxruntime()
    options = ort.SessionOptions()
    # The host's cores, like torch's default; the harness pins threads the same way for both.
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ONNX Runtime's worker threads spin after each run waiting for the next; under assistance the
    # next thing on these cores is the torch draft, which they would slow down.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def load(folder: Path, source: Path, settings: OrtSettings, threads: int | None = None) -> OrtCausalLM:
    """The exported model in ``folder`` on ``settings.provider``; config from the source folder."""
    ort = _import_onnxruntime()
    session = ort.InferenceSession(
        str(folder / "model.onnx"), session_options(threads), providers=[settings.provider]
    )
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    model = OrtCausalLM(config, session, settings, folder, source)
    model.eval()
    return model
