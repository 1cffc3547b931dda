"""A Llama-family decoder layer in a handful of C++ calls, for models on the batch-invariant kernels.

Why: a one-token step of the 1.5B target on its GGUF blocks spent about a third of its time outside
the matrix kernels, in ~40 small torch ops per layer (norms, rotary embedding, residuals, the gated
activation, transposes) whose dispatch costs more than their arithmetic. Here a layer is: norm, one
call for q/k/v (the input quantized once), rotary embedding in place, the cache update, attention on
the projection's own layout, the output projection, residual + norm, one call for gate/up, the gated
activation, the down projection, residual. Every step is row-wise in one fixed order
(``harness/kernels/invariant.cpp``), so a K+1-token verification still computes each row exactly as
a one-token step does.

When every projection of a layer is on k-quant blocks, the steps run as two C++ calls around the
cache update (``kernels/layer.cpp``: the same functions, compiled into one module), not one call a
step: ten calls a layer from Python cost ~3% of a one-token step, draft and target alike.

The decoder stack around them runs its fused layers in a plain loop when nothing could tell the
difference (``FusedStack``): its own forward builds a causal mask the fused layers never read and
calls each layer through the module-call machinery, ~0.5 ms of the 0.5B draft's ~7.5 ms step.

The layers keep their modules and names (the layer's class is swapped for a subclass whose forward
is the fused one), so hooks, deep copies and ``named_modules`` see the model they saw before.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

from harness.base.errors import HarnessError
from harness.kernels import cppext, invariant, kquants

# Decoder layers whose forward this module reproduces: pre-norm RMSNorm, rotate-half rotary
# embedding, grouped-query attention, SiLU-gated MLP.
FUSABLE = ("LlamaDecoderLayer", "Qwen2DecoderLayer")
# Their decoder stacks: embedding, rotary tables, the layers, the final norm.
FUSABLE_STACKS = ("LlamaModel", "Qwen2Model")
# The stacks' final norms: ``weight * (x * rsqrt(mean(x^2) + eps))`` per row.
FUSABLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")


_SOURCE = Path(__file__).with_name("layer.cpp")


@functools.cache
def extension():
    """A decoder layer on k-quant blocks in two C++ calls (``kernels/layer.cpp``, which compiles the
    row-wise steps and the k-quant kernels in; built once, ~2 min)."""
    return cppext.build("assisted_generation_layer", _SOURCE, (invariant._SOURCE, kquants._SOURCE))


def project(x: torch.Tensor, linears: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Each linear applied to ``x`` [M, K]; k-quant weights share one quantization of ``x``."""
    return _projection(linears)(x)


def _projections(layer: nn.Module) -> tuple[tuple[nn.Module, ...], ...]:
    """A decoder layer's linears, grouped as the fused layer applies them to one input each: q/k/v,
    o, gate/up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return (
        (attn.q_proj, attn.k_proj, attn.v_proj),
        (attn.o_proj,),
        (mlp.gate_proj, mlp.up_proj),
        (mlp.down_proj,),
    )


def _on_kquants(layer: nn.Module) -> bool:
    """Whether a fused layer runs as two C++ calls: every projection on k-quant blocks."""
    return isinstance(layer, FusedLayer) and all(
        _kquant_args(group) is not None for group in _projections(layer)
    )


def _kquant_args(linears: Sequence[nn.Module]) -> tuple[list, list, list, list] | None:
    """The k-quant kernels' arguments for ``linears`` applied to one input (blocks, block types,
    output widths, biases), or None when any of them is not on k-quant blocks."""
    if not all(type(lin) is kquants.KQuantLinear for lin in linears):
        return None
    return (
        [lin.blocks for lin in linears],
        [lin.kind for lin in linears],
        [lin.out_features for lin in linears],
        [lin.bias for lin in linears],
    )


def _projection(linears: Sequence[nn.Module]) -> Any:
    """``x -> [linear(x) for linear in linears]``, with the k-quant call's arguments gathered once."""
    args = _kquant_args(linears)
    if args is not None:
        linear = kquants.extension().linears
        return lambda x: linear(x, *args)
    return lambda x: [lin.forward(x) for lin in linears]


@dataclass(frozen=True)
class _Plan:
    """What a fused layer's forward reads of its modules, gathered at its first call. Why: read
    through ``nn.Module.__getattr__`` on every call it was ~30 attribute lookups and four argument
    lists per layer and step, most of a 24-layer draft's Python time around its kernels. It holds
    the layer's tensors by reference: ``fuse`` drops it (a layer whose weights are replaced is fused
    again), and a deep copy of the layer starts without one."""

    owner: int  # id() of the layer it was gathered from
    heads: int
    kv_heads: int
    dim: int
    scaling: float
    layer_idx: int
    in_norm: tuple[torch.Tensor, float]
    post_norm: tuple[torch.Tensor, float]
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    native: Any  # the layer in two C++ calls (layer.cpp) when every projection is on k-quant blocks

    def __deepcopy__(self, memo: dict) -> None:
        # A copied layer gathers its own plan from its own modules (the C++ layer cannot be copied,
        # and would hold the original's weights).
        return None

    @classmethod
    def of(cls, layer: nn.Module) -> _Plan:
        attn = layer.self_attn
        groups = _projections(layer)
        in_norm = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        post_norm = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
        native = None
        kquant = [_kquant_args(group) for group in groups]
        if all(args is not None for args in kquant):
            ext = extension()
            sizes = (heads, kv_heads, attn.head_dim, attn.scaling)
            native = ext.Layer(*sizes, *in_norm, *post_norm, *(ext.Projection(*args) for args in kquant))
        return cls(
            id(layer),
            heads,
            kv_heads,
            attn.head_dim,
            attn.scaling,
            attn.layer_idx,
            in_norm,
            post_norm,
            *(_projection(group) for group in groups),
            native,
        )


# Room a layer's cache buffer is given beyond what it holds when it is (re)allocated.
CACHE_HEADROOM = 256


def append_kv(
    cache: Any, index: int, keys: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cache.update`` for layer ``index``, without a copy of the whole cache per token.

    Why: transformers' ``DynamicLayer`` appends with ``torch.cat``, a fresh allocation of the whole
    cache for every layer and step; past ~100 KB each is a new mapping whose pages fault in, and
    the two cats of a layer cost ~25 us each (~1.2 ms of the 0.5B draft's ~9 ms step, more for the
    target). Here a plain ``DynamicLayer`` keeps its keys and values as the first L positions of a
    buffer with room to grow: new rows are written in place and ``keys``/``values`` stay views, so
    ``crop``, ``get_seq_length`` and every reader see the layer they always saw. The values read
    are the same: attention's bits do not change. Any other cache (sliding, quantized, offloaded)
    takes its own ``update``."""
    layer = _growable(cache, index)
    if layer is None:
        return cache.update(keys, values, index)
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    m = keys.shape[-2]
    buf, n = _room(layer, m, keys, values)
    buf[0].narrow(-2, n, m).copy_(keys)
    buf[1].narrow(-2, n, m).copy_(values)
    return _hold(layer, buf, n + m)


def _plain_layers(cache: Any) -> list | None:
    """The layers of ``cache`` when it is a plain ``DynamicCache`` (not offloaded), whose plain
    ``DynamicLayer``s this module grows in place; None for any other cache."""
    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return None
    return layers


def _growable(cache: Any, index: int) -> Any:
    """Layer ``index`` of ``cache`` when it is a plain ``DynamicLayer`` of a plain ``DynamicCache``,
    which ``append_kv`` grows in place; None for any other cache or layer."""
    layers = _plain_layers(cache)
    if layers is None or index >= len(layers) or type(layers[index]) is not DynamicLayer:
        return None
    return layers[index]


def _room(
    layer: Any, m: int, keys: torch.Tensor, values: torch.Tensor
) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """The (initialized) layer's buffers with room for ``m`` more rows, and how many rows it holds;
    reallocated, its rows copied over, when it holds anything other than their first rows or they
    are full. ``keys``/``values``: tensors of the cache's layout ([..., rows, dim]) to shape them."""
    old_k, old_v = layer.keys, layer.values
    buf = layer.__dict__.get("_buffers_kv")
    views = layer.__dict__.get("_views_kv")
    if (
        views is not None
        and old_k is views[0]
        and old_v is views[1]
        and old_k.shape[-2] + m <= buf[0].shape[-2]
    ):
        # The layer still holds the views this module left (no crop or reset since): they are the
        # buffers' first n rows, so the checks below would pass; ~40% of its time per call.
        return buf, old_k.shape[-2]
    n = old_k.shape[-2] if old_k.dim() == 4 else 0
    if (
        buf is None
        or not (_prefix_of(old_k, buf[0], n) and _prefix_of(old_v, buf[1], n))
        or n + m > buf[0].shape[-2]
    ):
        capacity = n + m + CACHE_HEADROOM
        shape = (*keys.shape[:-2], capacity, keys.shape[-1])
        buf = (keys.new_empty(shape), values.new_empty((*values.shape[:-2], capacity, values.shape[-1])))
        if n:
            buf[0][..., :n, :].copy_(old_k)
            buf[1][..., :n, :].copy_(old_v)
        layer._buffers_kv = buf
    return buf, n


def _hold(layer: Any, buf: tuple[torch.Tensor, torch.Tensor], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer holds its buffers' first ``rows`` as its keys and values (views, remembered to know
    them again on the next call)."""
    return _keep(layer, (buf[0].narrow(-2, 0, rows), buf[1].narrow(-2, 0, rows)))


def _keep(layer: Any, views: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer holds ``views`` of its buffers as its keys and values, remembered as this module's."""
    layer.keys, layer.values = layer._views_kv = views
    return views


def _prefix_of(view: torch.Tensor, buffer: torch.Tensor, n: int) -> bool:
    """Whether ``view`` is ``buffer``'s first ``n`` positions (as ``append_kv`` left them, or cropped)."""
    return (
        view.dim() == buffer.dim()
        and view.data_ptr() == buffer.data_ptr()
        and view.stride() == buffer.stride()
        and view.shape[:-2] == buffer.shape[:-2]
        and view.shape[-1] == buffer.shape[-1]
        and n <= buffer.shape[-2]
    )


class FusedLayer:
    """The fused forward, mixed in ahead of a decoder layer class (see ``fuse``)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values=None,
        **kwargs,
    ) -> torch.Tensor:
        if hidden_states.shape[0] != 1 or position_embeddings is None or hidden_states.dtype != torch.float32:
            # Batches and other dtypes take the model's own path (assisted generation runs neither),
            # the cache passed on under the name it came by (transformers renamed it across 5.x).
            names = {"cache": cache, "past_key_values": past_key_values}
            return super().forward(
                hidden_states,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
                **{name: value for name, value in names.items() if value is not None},
                **kwargs,
            )
        cache = cache if cache is not None else past_key_values
        m, width = hidden_states.shape[1], hidden_states.shape[2]
        x = hidden_states.reshape(m, width).contiguous()
        return self.fused_rows(x, position_embeddings, cache).view(1, m, width)

    def fused_rows(
        self, x: torch.Tensor, position_embeddings: tuple, cache: Any, visible: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The fused layer on rows ``x`` [M, width] (float32, one sequence): its output [M, width].
        ``visible``: a token tree's mask over the cache's last entries (``tree_mask``)."""
        plan = self.plan()
        run = layer_calls if plan.native is not None else step_calls
        return run(plan, x, position_embeddings, cache, visible)

    def plan(self) -> _Plan:
        """What the fused forward reads of this layer, gathered at its first call."""
        plan = self.__dict__.get("_plan")
        if plan is None or plan.owner != id(self):
            plan = self.__dict__["_plan"] = _Plan.of(self)
        return plan


class FusedStack:
    """The decoder stack's forward over fused layers, mixed in ahead of its class (see ``fuse``): the
    embedding, rotary tables and final norm as the stack's own modules, the layers' fused steps in a
    plain loop (the same calls in the same order as through each layer's forward: the same bits).
    Anything it does not reproduce takes the stack's own forward: batches, input embeddings, no cache,
    hidden states or attentions asked for, a padding mask, hooks on a layer, a layer not fused.

    ``tree_mask`` (a token tree's rows, ``harness.decoding.trees``) is this loop's alone: a call
    that would take the stack's own forward with one is refused, never run with the mask dropped."""

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        tree_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        # A tuple, not a slice of the ModuleList: a slice is a new ModuleList, every layer registered
        # into it again on every forward.
        layers = tuple(self.layers)[: self.config.num_hidden_layers]
        if not _direct(self, layers, input_ids, inputs_embeds, attention_mask, past_key_values, kwargs):
            if tree_mask is not None:
                raise HarnessError(
                    "a token tree runs on fused layers only: one sequence of token ids onto a cache, "
                    "float32, every layer fused and without hooks"
                )
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                inputs_embeds=inputs_embeds,
                use_cache=use_cache,
                **kwargs,
            )
        m = input_ids.shape[1]
        hidden = self.embed_tokens(input_ids)
        if position_ids is None:
            start = past_key_values.get_seq_length()
            cos, sin = rotary_rows(self, hidden, range(start, start + m))
        else:
            cos, sin = rotary_rows(self, hidden, position_ids)
        x = hidden.reshape(m, -1).contiguous()
        masked = 0 if tree_mask is None else tree_mask.shape[0]
        native = _native_stack(self, layers)
        parts = []
        for i0, i1 in prefill_chunks(m, masked):
            part, tables = x[i0:i1], (cos[:, i0:i1], sin[:, i0:i1])
            mask = tree_mask if i1 == m else None  # a tree's rows are the last chunk's
            out = None if native.native is None else _stack_call(native, part, tables, past_key_values, mask)
            if out is None:
                for layer in layers:
                    part = layer.fused_rows(part, tables, past_key_values, mask)
                out = part
            parts.append(out)
        x = parts[0] if len(parts) == 1 else torch.cat(parts)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(x.view(1, m, -1)),
            past_key_values=past_key_values if use_cache else None,
        )


class FusedNorm:
    """The decoder stack's final norm on the row-wise kernel its fused layers' norms run
    (``invariant.cpp``'s ``rms_norm``), mixed in ahead of its class (see ``fuse``).

    Why: transformers' norm is six torch ops, and after a step's weights have streamed through the
    caches their dispatch took 0.13-0.21 ms of every one-token step of either model of the offline
    pair on a 2-core AMD EPYC Zen 4 (family 25 model 17), the kernel 0.03 ms. And every row-wise
    step of a fused model then computes a row in one fixed order whatever M is, the last one
    included. The kernel's sum of squares runs in its own order, so a row's bits may differ from
    transformers' norm in the last place (``test_rms_norm_matches_the_models_norm`` holds them
    close); the stack's own forward, taken when a layer is hooked, calls this norm too, so both
    paths keep one set of bits. Other dtypes take the module's own forward."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if hidden_states.dtype != torch.float32 or weight.dtype != torch.float32 or weight.dim() != 1:
            return super().forward(hidden_states)
        rows = hidden_states.reshape(-1, hidden_states.shape[-1]).contiguous()
        # The module the layers run on (``fuse`` says which): the same source compiled into both,
        # the same bits; only the one a model needs anyway gets built.
        kernels = extension() if self.__dict__.get("_on_kquants") else invariant.extension()
        return kernels.rms_norm(rows, weight, self.variance_epsilon).view(hidden_states.shape)


@dataclass(frozen=True)
class _NativeStack:
    """The stack's layers as one C++ call (``layer.cpp``'s ``Stack``), with the layer plans it was
    built from: it is built again when any layer's plan is (a layer fused again)."""

    plans: tuple[_Plan, ...]
    native: Any
    indices: tuple[int, ...]  # each layer's index in the cache

    def __deepcopy__(self, memo: dict) -> None:
        # A copied stack builds its own from its own layers' plans (see ``_Plan.__deepcopy__``).
        return None


def _native_stack(stack: nn.Module, layers: Sequence[nn.Module]) -> _NativeStack:
    """The stack's layers as one C++ call when every one runs as two C++ calls (k-quant
    projections); ``native`` None otherwise."""
    plans = tuple(layer.plan() for layer in layers)
    built = stack.__dict__.get("_native_stack")
    same = built is not None and len(built.plans) == len(plans)
    if not (same and all(a is b for a, b in zip(built.plans, plans, strict=True))):
        native = None
        if all(plan.native is not None for plan in plans):
            native = extension().Stack([plan.native for plan in plans])
        built = _NativeStack(plans, native, tuple(plan.layer_idx for plan in plans))
        stack.__dict__["_native_stack"] = built
    return built


def _stack_call(
    native: _NativeStack, x: torch.Tensor, tables: tuple, cache: Any, visible: torch.Tensor | None
) -> torch.Tensor | None:
    """Rows ``x`` through every layer in one C++ call, onto ``cache`` grown in place as ``append_kv``
    grows it; None (nothing run) unless every layer's cache is a plain one already holding the same
    number of rows (a fresh cache's first chunk takes the layer loop, which starts its layers)."""
    held = _plain_layers(cache)
    if held is None or max(native.indices) >= len(held):
        return None
    layers = [held[index] for index in native.indices]
    if any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return None
    bufs = [layer.__dict__.get("_buffers_kv") for layer in layers]
    if None not in bufs:
        # The usual step: every layer holds the first rows of its buffers, with room.
        done = native.native.forward_held(
            x,
            *tables,
            [layer.keys for layer in layers],
            [layer.values for layer in layers],
            [buf[0] for buf in bufs],
            [buf[1] for buf in bufs],
            visible,
        )
        if done is not None:
            out, keys, values = done
            for layer, k, v in zip(layers, keys, values, strict=True):
                _keep(layer, (k, v))
            return out
    m = x.shape[0]
    grown, keys, values, n = [], [], [], None
    for layer in layers:
        if layer.keys.dim() != 4:
            return None
        buf, rows = _room(layer, m, layer.keys, layer.values)
        if n is not None and rows != n:
            return None
        n = rows
        grown.append((layer, buf))
        keys.append(buf[0])
        values.append(buf[1])
    out = native.native.forward(x, *tables, keys, values, n, visible)
    for layer, buf in grown:
        _hold(layer, buf, n + m)
    return out


# Rows of a long forward (a prompt's prefill) that run through the whole stack at a time, chunk after
# chunk onto the cache, as llama.cpp's micro-batches do. Every row's arithmetic is its own whatever M
# is (the kernels' invariance), so the bits are those of one call; what changes is the memory: the
# layer's intermediates for M rows ([M, intermediate] floats, three of them) came fresh from the OS
# on every layer, their pages faulted in and zeroed (1.5 million faults and 3.5 s of kernel time in
# a 14.5 s prefill of 2K tokens on a 2-core AMD EPYC Zen 4), where a chunk's are reused from the
# heap; and a chunk's activation codes stay in cache while each group of weights reads them, where a
# long prompt's streamed from memory once per group.
PREFILL_ROWS = 256


def prefill_chunks(m: int, masked: int = 0, rows: int | None = None) -> list[tuple[int, int]]:
    """The row ranges a forward of ``m`` rows runs in: ``rows`` (``PREFILL_ROWS``) at a time, the
    last ``masked`` rows (a token tree's) all in the last range."""
    rows = PREFILL_ROWS if rows is None else rows
    cuts = [c for c in range(rows, m, rows) if c <= m - masked]
    return list(itertools.pairwise([0, *cuts, m]))


# Positions a stack's kept rotary tables cover at first, doubled whenever a forward reaches past them.
ROTARY_ROWS = 1024


@dataclass(frozen=True)
class _RotaryTables:
    """The rotary module's cos and sin for positions [0, n), as it computed them in one call, and
    the inverse frequencies they came from (a module given new ones is computed again)."""

    inv_freq: torch.Tensor
    cos: torch.Tensor  # [1, n, dim]
    sin: torch.Tensor


def rotary_rows(
    stack: nn.Module, hidden: torch.Tensor, positions: range | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``stack.rotary_emb(hidden, positions)`` for one sequence, read from tables the stack keeps:
    ``positions`` a range (a forward's rows onto a cache, a slice of the tables) or position ids
    [1, m] as a caller passes them (a token tree's rows repeat and skip positions; gathered).

    Why: the module computes a forward's rows anew each time (a product, a concatenation, cos and
    sin, ~20 us with everything in cache), and after a step's weights have streamed through the
    caches that came to 0.13-0.14 ms of every one-token step of either model of the offline pair
    on a 2-core AMD EPYC Zen 4 (family 25 model 17); with position ids given (the token-tree loop
    passes them), 0.12 ms of the draft's step there (0.986x its time). Each row is its position's
    alone (one product per entry, then cos and sin entry by entry), so rows computed for all
    positions at once are the bits of one position at a time (``test_rotary_rows_are_the_modules``).
    Only for the plain rotary embedding (a scaled or dynamic one may depend on more than the
    position), float32, an unobserved module and positions from 0 up; anything else is the module's
    own call."""
    rot = stack.rotary_emb
    ids = positions if isinstance(positions, torch.Tensor) else None
    if ids is None:
        end = positions.stop
    elif ids.dim() == 2 and ids.shape[0] == 1 and ids.numel() > 0:
        low, high = (int(bound) for bound in torch.aminmax(ids))
        end = high + 1 if low >= 0 else 0
    else:
        end = 0  # a batch, or nothing: the module's own call
    plain = getattr(rot, "rope_type", None) == "default" and hidden.dtype == torch.float32
    if not plain or end <= 0 or rot._forward_hooks or rot._forward_pre_hooks:
        if ids is None:
            ids = torch.arange(positions.start, positions.stop, device=hidden.device).unsqueeze(0)
        return rot(hidden, ids)
    kept = stack.__dict__.get("_rotary_tables")
    held = 0 if kept is None or kept.inv_freq is not rot.inv_freq else kept.cos.shape[1]
    if end > held or kept.cos.device != hidden.device:
        n = max(ROTARY_ROWS, 2 * held, end)
        cos, sin = rot(hidden, torch.arange(n, device=hidden.device).unsqueeze(0))
        kept = stack.__dict__["_rotary_tables"] = _RotaryTables(rot.inv_freq, cos, sin)
    if ids is None:
        return kept.cos[:, positions.start : end], kept.sin[:, positions.start : end]
    rows = ids[0].to(kept.cos.device)
    return kept.cos.index_select(1, rows), kept.sin.index_select(1, rows)


def _direct(
    stack: nn.Module,
    layers: Sequence[nn.Module],
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    cache: Any,
    kwargs: dict,
) -> bool:
    """Whether ``FusedStack`` may run the layers in its loop: one sequence of token ids onto a cache,
    float32, every layer fused and unobserved (a hook on a layer would not see the loop's calls),
    nothing asked for beyond the last hidden state, and no position masked out."""
    return (
        input_ids is not None
        and inputs_embeds is None
        and cache is not None
        and input_ids.dim() == 2
        and input_ids.shape[0] == 1
        and stack.embed_tokens.weight.dtype == torch.float32
        and not any(value for value in kwargs.values())
        and not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
        and all(
            isinstance(layer, FusedLayer) and not (layer._forward_hooks or layer._forward_pre_hooks)
            for layer in layers
        )
        and (attention_mask is None or (attention_mask.dim() == 2 and bool(attention_mask.all())))
    )


def layer_calls(
    plan: _Plan, x: torch.Tensor, position_embeddings: tuple, cache: Any, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """The layer in two C++ calls around the cache update: the steps of ``step_calls``, in its order."""
    q, keys, values = plan.native.begin(x, *position_embeddings)
    if cache is not None:
        keys, values = append_kv(cache, plan.layer_idx, keys, values)
    return plan.native.end(x, q, keys, values, visible)


def step_calls(
    plan: _Plan, x: torch.Tensor, position_embeddings: tuple, cache: Any, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """The layer one step a call: x [M, width] -> the layer's output [M, width]; ``visible``: which
    of the cache's last entries each row attends to (a token tree's ancestors; None: causal)."""
    ext = invariant.extension()
    m = x.shape[0]
    h = ext.rms_norm(x, *plan.in_norm)
    q, k, v = plan.qkv(h)
    cos, sin = (t[0].float().contiguous() for t in position_embeddings)
    ext.rope_(q, cos, sin, plan.heads)
    ext.rope_(k, cos, sin, plan.kv_heads)
    keys = k.view(1, m, plan.kv_heads, plan.dim).transpose(1, 2)
    values = v.view(1, m, plan.kv_heads, plan.dim).transpose(1, 2)
    if cache is not None:
        keys, values = append_kv(cache, plan.layer_idx, keys, values)
    (o,) = plan.o(ext.attention_md(q, keys[0], values[0], plan.heads, plan.scaling, visible))
    x, h = ext.add_rms_norm(x, o, *plan.post_norm)
    gate, up = plan.gate_up(h)
    (down,) = plan.down(ext.silu_mul(gate, up))
    return x.add_(down)


def fusable(layer: nn.Module) -> bool:
    """Whether ``layer`` is a decoder layer whose structure the fused forward reproduces. Any rotary
    scaling is fine: the tables come from the model (``position_embeddings``), only their
    rotate-half application is done here."""
    if type(layer).__name__ not in FUSABLE:
        return False
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (
        getattr(layer.self_attn.config, "hidden_act", None) == "silu"
        and getattr(layer.self_attn, "sliding_window", None) is None
        and all(n.weight.dtype == torch.float32 for n in norms)
    )


@functools.cache
def _fused_class(cls: type, mixin: type = FusedLayer) -> type:
    return type(f"Fused{cls.__name__}", (mixin, cls), {"__module__": __name__})


def fuse(model: nn.Module) -> int:
    """Switch every fusable decoder layer of ``model`` to the fused forward, the stacks holding
    them to ``FusedStack`` and their final norms to ``FusedNorm``, in place; returns how many layers
    were switched (0: the architecture is not one this module reproduces, nothing changed)."""
    count = 0
    for module in model.modules():
        if isinstance(module, FusedLayer):
            module.__dict__.pop("_plan", None)
            count += 1
        elif fusable(module):
            module.__class__ = _fused_class(type(module))
            count += 1
    for module in model.modules():
        if isinstance(module, FusedStack):
            _fuse_norm(module)  # fused again: its layers' kernels may have changed
        elif type(module).__name__ in FUSABLE_STACKS and any(
            isinstance(layer, FusedLayer) for layer in module.layers
        ):
            module.__class__ = _fused_class(type(module), FusedStack)
            _register_outputs(module)
            _fuse_norm(module)
    return count


def _fuse_norm(stack: nn.Module) -> None:
    """Switch the stack's final norm to ``FusedNorm`` (when it is one of ``FUSABLE_NORMS``), on the
    kernels' module its layers run on: the two-call layers' (``layer.cpp``) when every layer's
    projections are on k-quant blocks, the row-wise steps' otherwise."""
    norm = stack.norm
    if not isinstance(norm, FusedNorm):
        if type(norm).__name__ not in FUSABLE_NORMS:
            return
        norm.__class__ = _fused_class(type(norm), FusedNorm)
    norm._on_kquants = all(_on_kquants(layer) for layer in stack.layers)


def _register_outputs(stack: nn.Module) -> None:
    """Register the swapped stack for transformers' output capture as its model's init registered
    its own class: hidden states and attentions are recorded for registered classes only (by class
    name), and the stack's own forward, taken when they are asked for, would return none."""
    from transformers.utils import output_capturing

    output_capturing._CAN_RECORD_REGISTRY[stack] = stack._can_record_outputs
