"""The fused decoder layer: the model's own layer in a few C++ calls, every row independent of M."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import load_pair
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kquants import layer
from transformers.models.qwen2 import modeling_qwen2

from harness.experiments import row_divergence
from harness.kernels import fused, invariant, kquants
from harness.weights import tiny

FUSABLE_FAMILIES = ("tiny-llama", "tiny-codellama", "tiny-qwen2")


@pytest.fixture(scope="module")
def ext():
    return invariant.extension()


def _logits(model: torch.nn.Module, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Logits of the tokens after a prefill, fed in chunks of the given sizes."""
    from transformers import DynamicCache

    cache, out, start = DynamicCache(), [], len(ids) - sum(chunks)
    with torch.inference_mode():
        model(torch.tensor([ids[:start]]), past_key_values=cache, use_cache=True)
        for n in chunks:
            out.append(
                model(torch.tensor([ids[start : start + n]]), past_key_values=cache, use_cache=True).logits[0]
            )
            start += n
    return torch.cat(out)


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@pytest.mark.parametrize("prec", ("fp32", "w8af32"))
def test_fused_layers_compute_the_models_own_layers(ext, name, prec):
    """Same weights, same steps: the fused model's logits are the unfused model's up to float
    rounding (fp32: sums in another order; w8af32 as well, its activation codes then rarely move)."""
    plain = invariant.apply_precision(tiny.build_target(name), prec)
    model = copy.deepcopy(plain)
    assert fused.fuse(model) == model.config.num_hidden_layers
    assert all(isinstance(layer, fused.FusedLayer) for layer in model.model.layers)
    ids = list(range(3, 40))
    a, b = _logits(model, ids, [6]), _logits(plain, ids, [6])
    tol = 1e-4 if prec == "fp32" else 0.05
    assert float((a - b).abs().max()) <= tol * float(b.abs().max())
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@settings(max_examples=6, deadline=None)
@given(m=st.integers(min_value=2, max_value=9), prefix=st.integers(min_value=1, max_value=30))
def test_fused_rows_do_not_depend_on_how_many_are_computed(ext, name, m, prefix):
    model = invariant.apply_precision(tiny.build_target(name), "w8af32")
    fused.fuse(model)
    ids = list(range(3, 3 + prefix + m))
    assert torch.equal(_logits(model, ids, [m]), _logits(model, ids, [1] * m))


def test_the_measurement_sees_fused_layers_as_exact(ext):
    """row_divergence over a fused model compares the layers themselves (one module each)."""
    model = invariant.apply_precision(tiny.build_target("tiny-qwen2"), "w8af32")
    fused.fuse(model)
    report = {d.op: d for d in row_divergence.row_divergence(model, list(range(3, 40)), 5)}
    assert "FusedQwen2DecoderLayer" in report
    assert all(d.exact for d in report.values()), report


def test_only_layers_it_reproduces_are_fused(ext):
    opt = invariant.apply_precision(tiny.build_target("tiny-opt"), "fp32")
    assert fused.fuse(opt) == 0  # LayerNorm, learned positions: not this layer
    bf16 = invariant.apply_precision(tiny.build_target("tiny-qwen2"), "bf16")
    assert fused.fuse(bf16) == 0  # activations in bf16 between layers: the model's own path keeps them
    model = invariant.apply_precision(tiny.build_target("tiny-qwen2"), "fp32")
    n = fused.fuse(model)
    classes = [type(layer) for layer in model.model.layers]
    assert fused.fuse(model) == n == model.config.num_hidden_layers  # a second call changes nothing
    assert [type(layer) for layer in model.model.layers] == classes


def test_a_batch_takes_the_models_own_layer_with_its_cache():
    """Two sequences at once are not the fused path's: the model's own layer runs them, and the
    cache reaches it (the second step attends to the first's keys)."""
    plain = tiny.build_target("tiny-qwen2").eval()
    model = copy.deepcopy(plain)
    assert fused.fuse(model) == model.config.num_hidden_layers
    ids = torch.tensor([list(range(3, 15)), list(range(20, 32))])
    expected, got = _logits_batched(plain, ids), _logits_batched(model, ids)
    torch.testing.assert_close(got, expected)


def _logits_batched(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        model(ids[:, :-1], past_key_values=cache, use_cache=True)
        return model(ids[:, -1:], past_key_values=cache, use_cache=True).logits


def test_the_loaded_pair_is_fused_on_the_invariant_kernels_only(ext):

    pair = load_pair("tiny-qwen2", target_kernels="invariant", draft_kernels="stock")
    assert all(isinstance(layer, fused.FusedLayer) for layer in pair.target.model.layers)
    assert not any(isinstance(layer, fused.FusedLayer) for layer in pair.draft.model.layers)


# --------------------------------------------------------------------------- the layer in two calls


def _q4k(name: str) -> torch.nn.Module:
    from harness.pairs import models

    return models._apply_precision(tiny.build_target(name), "q4k", "invariant", None)


def _run_layer(run, model, plan, x: torch.Tensor, start: int, cache) -> torch.Tensor:
    """``run`` (one of the fused forwards) on rows ``x`` at positions ``start``, ``start + 1``, ..."""
    positions = torch.arange(start, start + x.shape[0])[None]
    with torch.inference_mode():
        return run(plan, x.clone(), model.model.rotary_emb(x[None], positions), cache)


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 9), prefix=st.integers(1, 20), seed=st.integers(0, 99))
def test_the_two_call_layer_is_the_step_by_step_layer_bit_for_bit(name, m, prefix, seed):
    """On k-quant blocks a fused layer runs as two C++ calls around the cache update; the same steps
    in the same order as one call a step, so the same bits: its output, and the cache it leaves."""
    from transformers import DynamicCache

    model = _q4k(name)
    _logits(model, list(range(3, 10)), [1])  # each layer gathers its plan
    layer = model.model.layers[-1]
    plan = layer.__dict__["_plan"]
    assert plan.native is not None
    g = torch.Generator().manual_seed(seed)
    width = model.config.hidden_size
    past, x = torch.randn(prefix, width, generator=g), torch.randn(m, width, generator=g)
    outs, caches = [], []
    for run in (fused.layer_calls, fused.step_calls):
        cache = DynamicCache()
        _run_layer(run, model, plan, past, 0, cache)
        outs.append(_run_layer(run, model, plan, x, prefix, cache))
        caches.append(cache)
    assert torch.equal(outs[0], outs[1])
    first, second = (c.layers[layer.self_attn.layer_idx] for c in caches)
    assert torch.equal(first.keys, second.keys) and torch.equal(first.values, second.values)


def test_only_k_quant_layers_run_as_two_calls(ext):
    """Every projection on k-quant blocks: two calls; any other linear: one call a step."""
    ids = list(range(3, 12))
    q4k = _q4k("tiny-qwen2")
    w8 = invariant.apply_precision(tiny.build_target("tiny-qwen2"), "w8af32")
    fused.fuse(w8)
    for model in (q4k, w8):
        _logits(model, ids, [1])
    assert all(layer.__dict__["_plan"].native is not None for layer in q4k.model.layers)
    assert all(layer.__dict__["_plan"].native is None for layer in w8.model.layers)


def test_the_layer_module_is_rebuilt_when_a_kernel_file_it_includes_changes(tmp_path):
    from harness.kernels import cppext

    included = tmp_path / "kernels.cpp"
    included.write_text("int f() { return 1; }")
    before = cppext.compile_flags((included,))
    assert before[: len(cppext.CFLAGS)] == cppext.CFLAGS and before == cppext.compile_flags((included,))
    included.write_text("int f() { return 2; }")
    assert cppext.compile_flags((included,)) != before
    assert cppext.compile_flags() == cppext.CFLAGS


# --------------------------------------------------------------------------- the row-wise steps


def test_rope_is_transformers_rotary_embedding_bit_for_bit(ext):
    torch.manual_seed(0)
    m, heads, dim = 5, 3, 16
    q = torch.randn(1, heads, m, dim)
    cos, sin = torch.randn(1, m, dim), torch.randn(1, m, dim)
    expected, _ = modeling_qwen2.apply_rotary_pos_emb(q, q, cos, sin)
    rows = q.transpose(1, 2).reshape(m, heads * dim).contiguous()
    ext.rope_(rows, cos[0].contiguous(), sin[0].contiguous(), heads)
    assert torch.equal(rows, expected.transpose(1, 2).reshape(m, heads * dim))


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
def test_rotary_rows_are_the_modules(name):
    """The stack's kept rotary tables give the rotary module's own rows, bit for bit, for every
    range of positions (past the tables' first size too) and for position ids as a token tree
    passes them (repeated, skipped, out of order), and follow the module: new inverse frequencies
    are computed again, and an observed module is called, not read around."""
    model = tiny.build_target(name).eval()
    stack, dim = model.model, model.config.hidden_size
    hidden = torch.zeros(1, 1, dim)

    def own(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return stack.rotary_emb(hidden, ids)

    def same(got: tuple, expected: tuple) -> bool:
        return all(g.shape == e.shape and torch.equal(g, e) for g, e in zip(got, expected, strict=True))

    with torch.inference_mode():
        for start, m in ((0, 200), (200, 1), (201, 5), (1023, 2), (fused.ROTARY_ROWS * 3 + 7, 4), (5, 1)):
            ids = torch.arange(start, start + m).unsqueeze(0)
            assert same(fused.rotary_rows(stack, hidden, range(start, start + m)), own(ids)), (start, m)
            assert same(fused.rotary_rows(stack, hidden, ids), own(ids)), (start, m)
        assert stack.__dict__["_rotary_tables"].cos.shape[1] >= fused.ROTARY_ROWS * 3 + 11
        for ids in ([[300, 301, 301, 302, 302, 302]], [[9, 3, 7]], [[fused.ROTARY_ROWS * 8 + 1, 0]]):
            ids = torch.tensor(ids)
            assert same(fused.rotary_rows(stack, hidden, ids), own(ids)), ids
        # What the tables do not hold goes to the module: negative positions, a batch of sequences.
        for ids in (torch.tensor([[-2, 5]]), torch.tensor([[4, 5], [6, 7]])):
            assert same(fused.rotary_rows(stack, hidden, ids), own(ids)), ids
        stack.rotary_emb.inv_freq = stack.rotary_emb.inv_freq * 0.5
        ids = torch.arange(40, 43).unsqueeze(0)
        assert same(fused.rotary_rows(stack, hidden, range(40, 43)), own(ids))
        assert same(fused.rotary_rows(stack, hidden, ids), own(ids))
        calls = []
        handle = stack.rotary_emb.register_forward_hook(lambda *args: calls.append(1))
        try:
            fused.rotary_rows(stack, hidden, range(40, 43))
            fused.rotary_rows(stack, hidden, ids)
        finally:
            handle.remove()
        assert calls == [1, 1]


def test_rms_norm_matches_the_models_norm(ext):
    torch.manual_seed(1)
    x, w = torch.randn(4, 96) * 3, torch.randn(96)
    norm = modeling_qwen2.Qwen2RMSNorm(96, eps=1e-6)
    norm.weight.data = w
    torch.testing.assert_close(ext.rms_norm(x, w, 1e-6), norm(x), rtol=1e-6, atol=1e-6)
    r = torch.randn(4, 96)
    s, h = ext.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(s, x + r)
    assert torch.equal(h, ext.rms_norm(x + r, w, 1e-6))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(min_value=1, max_value=70), shift=st.integers(min_value=0, max_value=9))
def test_silu_mul_is_elementwise_wherever_an_element_sits(ext, n, shift):
    """Close to torch's silu, and each element's bits are the same at any offset and length (the
    tail goes through the same vector code as the body)."""
    torch.manual_seed(n)
    g, u = torch.randn(1, n) * 8, torch.randn(1, n)
    out = ext.silu_mul(g, u)
    torch.testing.assert_close(out, torch.nn.functional.silu(g) * u, rtol=2e-6, atol=1e-6)
    pad = torch.randn(1, shift)
    shifted = ext.silu_mul(torch.cat([pad, g], 1), torch.cat([pad, u], 1))
    assert torch.equal(shifted[:, shift:], out)


def test_silu_mul_keeps_extremes_and_nan(ext):
    g = torch.tensor([[-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, float("nan")]])
    out = ext.silu_mul(g, torch.ones_like(g))
    torch.testing.assert_close(out[:, :7], torch.nn.functional.silu(g[:, :7]), rtol=2e-6, atol=1e-6)
    assert torch.isnan(out[0, 7])


def test_attention_on_the_layers_layout_is_attention_rows(ext):
    torch.manual_seed(2)
    heads, kv, m, length, dim = 4, 2, 3, 11, 16
    q = torch.randn(heads, m, dim)
    k, v = torch.randn(kv, length, dim), torch.randn(kv, length, dim)
    expected = ext.attention_rows(q, k, v, 0.25)
    got = ext.attention_md(q.transpose(0, 1).reshape(m, heads * dim).contiguous(), k, v, heads, 0.25)
    assert torch.equal(got, expected.transpose(0, 1).reshape(m, heads * dim))


# --------------------------------------------------------------------------- several k-quant weights


@pytest.mark.parametrize("force_avx2", (False, True))
def test_linears_equal_one_call_per_weight(force_avx2):
    """One quantization of the input shared by q, k and v (Q4_K and Q6_K mixed, a bias, a last group
    of fewer than 16 columns): each output is the single call's, bit for bit."""
    weights = [layer("Q4_K", 40, 2, 0)[1], layer("Q6_K", 16, 2, 1)[1], layer("Q4_K", 7, 2, 2)[1]]
    bias = torch.randn(16)
    x = torch.randn(5, 512)
    ext = kquants.extension()
    got = ext.linears(
        x,
        [w.blocks for w in weights],
        [w.kind for w in weights],
        [w.out_features for w in weights],
        [None, bias, None],
        force_avx2,
    )
    for w, y, b in zip(weights, got, [None, bias, None], strict=True):
        single = w.forward(x, force_avx2=force_avx2)
        assert torch.equal(y, single if b is None else single + b)


def test_linears_refuse_mismatched_lists():
    _, w = layer("Q4_K", 16, 1)
    with pytest.raises(RuntimeError, match="one length"):
        kquants.extension().linears(torch.randn(1, 256), [w.blocks], ["Q4_K", "Q4_K"], [16], [None])
    with pytest.raises(RuntimeError, match="Q5_0"):
        kquants.extension().linears(torch.randn(1, 256), [w.blocks], ["Q5_0"], [16], [None])


def test_project_shares_k_quant_inputs_and_calls_other_linears(ext):
    _, a = layer("Q4_K", 32, 1)
    _, b = layer("Q6_K", 16, 1, 3)
    x = torch.randn(2, 256)
    ya, yb = fused.project(x, (a, b))
    assert torch.equal(ya, a(x)) and torch.equal(yb, b(x))
    model = invariant.apply_precision(tiny.build_target("tiny-qwen2"), "fp32")
    lin = model.model.layers[0].mlp.up_proj
    x = torch.randn(2, lin.in_features)
    (y,) = fused.project(x, (lin,))
    assert torch.equal(y, lin(x))


def _cat_cache(steps: list[int]) -> tuple[list[torch.Tensor], object]:
    """A cache fed ``steps`` (n > 0: append n rows; n < 0: crop n) through ``append_kv``, checked
    at every step against transformers' own cache fed the same."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    mine, theirs = DynamicCache(), DynamicCache()
    for n in steps:
        if n < 0:
            mine.crop(n)
            theirs.crop(n)
        else:
            k, v = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
            got = fused.append_kv(mine, 0, k, v)
            want = theirs.update(k, v, 0)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert mine.get_seq_length() == theirs.get_seq_length()
    return [mine.layers[0].keys, mine.layers[0].values], mine


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 70), min_size=1, max_size=30))
def test_the_grown_cache_holds_what_transformers_cache_holds(sizes):
    """Appends (any number of rows) and crops in any order: the cache in a growing buffer returns,
    and keeps, exactly what ``DynamicLayer``'s concatenation does."""
    steps, held = [], 0
    for n in sizes:
        n = max(n, -held) if held else max(n, 1)  # never crop below one row, start with an append
        if n:
            steps.append(n)
            held += n
    _cat_cache(steps)


def test_the_cache_grows_in_place_and_readers_see_views():
    (keys, _), cache = _cat_cache([5, 1])  # the first append creates the layer, the second the buffer
    layer = cache.layers[0]
    buffer = layer._buffers_kv[0]
    assert keys.data_ptr() == buffer.data_ptr() and buffer.shape[-2] == 6 + fused.CACHE_HEADROOM
    fused.append_kv(cache, 0, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert layer.keys.data_ptr() == buffer.data_ptr() and cache.get_seq_length() == 7  # no new buffer
    # Past its room it moves to a larger buffer, contents kept.
    before, more = layer.keys.clone(), torch.ones(1, 2, fused.CACHE_HEADROOM, 8)
    fused.append_kv(cache, 0, more, more)
    assert layer._buffers_kv[0].data_ptr() != buffer.data_ptr()
    assert torch.equal(layer.keys[..., :7, :], before) and cache.get_seq_length() == 7 + fused.CACHE_HEADROOM


def test_attention_reads_a_cache_view_as_its_contiguous_copy(ext):
    g = torch.Generator().manual_seed(3)
    buffer_k, buffer_v = torch.randn(2, 40, 16, generator=g), torch.randn(2, 40, 16, generator=g)
    q = torch.randn(3, 4 * 16, generator=g)
    k, v = buffer_k[:, :25], buffer_v[:, :25]
    assert not k.is_contiguous()
    assert torch.equal(
        ext.attention_md(q, k, v, 4, 0.25), ext.attention_md(q, k.contiguous(), v.contiguous(), 4, 0.25)
    )


def test_other_caches_keep_their_own_update():
    from transformers import DynamicCache

    class Recording(DynamicCache):
        calls = 0

        def update(self, *args, **kwargs):
            Recording.calls += 1
            return super().update(*args, **kwargs)

    cache = Recording()
    fused.append_kv(cache, 0, torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    fused.append_kv(cache, 0, torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert Recording.calls == 2 and cache.get_seq_length() == 4


def _w8af32_fused(name: str) -> torch.nn.Module:
    model = invariant.apply_precision(tiny.build_target(name), "w8af32")
    fused.fuse(model)
    return model


@pytest.mark.parametrize("build", [_w8af32_fused, _q4k], ids=["one-call-a-step", "two-calls-on-k-quants"])
def test_a_copy_of_a_fused_model_runs_on_its_own_weights(ext, build):
    """A fused layer gathers what it reads of its modules once (on k-quant blocks, a C++ layer that
    holds its weights); a deep copy made after it ran must still run on its own weights (not the
    original's), as must a layer fused again after its weights were replaced."""
    model = build("tiny-qwen2")
    ids = list(range(3, 30))
    before = _logits(model, ids, [1])
    twin = copy.deepcopy(model)
    assert torch.equal(_logits(twin, ids, [1]), before)
    with torch.no_grad():
        twin.model.layers[0].input_layernorm.weight.mul_(2.0)
    assert not torch.equal(_logits(twin, ids, [1]), before)
    assert torch.equal(_logits(model, ids, [1]), before)
    first = model.model.layers[0]
    first.post_attention_layernorm = copy.deepcopy(first.post_attention_layernorm)
    with torch.no_grad():
        first.post_attention_layernorm.weight.mul_(0.5)
    fused.fuse(model)
    assert not torch.equal(_logits(model, ids, [1]), before)


# --------------------------------------------------------------------------- the stack in a loop


def _count_layer_forwards(monkeypatch, model: torch.nn.Module) -> list[int]:
    """Calls of the fused layers' own forward (the stack's loop calls their rows directly). On the
    layers' class: transformers wraps a layer class's forward when the class is made."""
    calls: list[int] = []
    cls = type(model.model.layers[0])
    forward = cls.forward

    def counted(self, *args, **kwargs):
        calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counted)
    return calls


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@pytest.mark.parametrize("build", [_w8af32_fused, _q4k], ids=["one-call-a-step", "two-calls-on-k-quants"])
def test_the_stack_loops_over_its_fused_layers_bit_for_bit(ext, monkeypatch, name, build):
    """A fused model's decoder stack runs its layers in a plain loop: the logits and the cache are
    those of the stack's own forward (taken when a layer is hooked), chunk after chunk."""
    from transformers import DynamicCache

    model = build(name)
    assert type(model.model).__name__.startswith("Fused")
    calls = _count_layer_forwards(monkeypatch, model)
    ids, chunks = list(range(3, 40)), [1, 4, 1, 9, 2]
    looped = _logits(model, ids, chunks)
    assert calls == []  # the loop, not the layers' forwards
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)
    try:
        own = _logits(model, ids, chunks)
    finally:
        handle.remove()
    assert len(calls) == model.config.num_hidden_layers * (1 + len(chunks))
    assert torch.equal(looped, own)
    caches = []
    for hooked in (False, True):
        cache = DynamicCache()
        handle = model.model.layers[-1].register_forward_pre_hook(lambda *args: None) if hooked else None
        with torch.inference_mode():
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        if handle is not None:
            handle.remove()
        caches.append(cache)
    for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
def test_a_stack_on_k_quants_is_one_call_a_forward_bit_for_bit(ext, monkeypatch, name):
    """On k-quant blocks the stack's layers run as one C++ call a forward once the cache holds rows
    (a fresh cache's first chunk starts its layers in the layer loop): the logits and the cache of
    the layers one call at a time, across crops (a draft's rejected tokens) and the cache's buffers
    growing past their room."""
    from transformers import DynamicCache

    monkeypatch.setattr(fused, "CACHE_HEADROOM", 3)
    model = _q4k(name)
    calls: list[int] = []
    per_layer = fused.layer_calls

    def counted(*args, **kwargs):
        calls.append(1)
        return per_layer(*args, **kwargs)

    monkeypatch.setattr(fused, "layer_calls", counted)
    steps = [list(range(3, 12)), [40], [41, 42, 43, 44], -2, [45], [46, 47, 48, 49, 50], -3, [51, 52]]
    steps.append([53] * 7)
    n = model.config.num_hidden_layers

    def run() -> tuple[list[torch.Tensor], DynamicCache]:
        cache, out = DynamicCache(), []
        with torch.inference_mode():
            for step in steps:
                if isinstance(step, int):
                    cache.crop(step)
                else:
                    out.append(model(torch.tensor([step]), past_key_values=cache, use_cache=True).logits[0])
        return out, cache

    one_call, cache = run()
    built = model.model.__dict__["_native_stack"]
    assert built.native is not None
    assert len(calls) == n  # the first chunk's layer loop only
    # Which of the stack's two entries each step took, on a second run: the first step after the
    # prefill gives the layers their buffers; then onto the caches as held where the buffers had
    # room ([45] and [51, 52], each after a crop), else the buffers grown first (the steps of 4, 5
    # and 7 rows, past their room of 3).
    taken: list[str] = []

    class Counted:
        def forward(self, *args):
            taken.append("grown")
            return built.native.forward(*args)

        def forward_held(self, *args):
            done = built.native.forward_held(*args)
            taken.append("held" if done is not None else "no room")
            return done

    model.model.__dict__["_native_stack"] = fused._NativeStack(built.plans, Counted(), built.indices)
    again, _ = run()
    assert taken == ["grown", "no room", "grown", "held", "no room", "grown", "held", "no room", "grown"]
    assert all(torch.equal(a, b) for a, b in zip(one_call, again, strict=True))
    assert len(calls) == 2 * n  # again, the first chunk's only
    calls.clear()
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)  # the layer loop throughout
    try:
        loop, loop_cache = run()
    finally:
        handle.remove()
    assert len(calls) == n * (len(steps) - 2)
    assert all(torch.equal(a, b) for a, b in zip(one_call, loop, strict=True))
    assert cache.get_seq_length() == loop_cache.get_seq_length() == 9 + 1 + 4 - 2 + 1 + 5 - 3 + 2 + 7
    for a, b in zip(cache.layers, loop_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_stack_not_all_on_k_quants_runs_its_layers_one_at_a_time(ext):
    """One layer off k-quant blocks and the stack has no single call: each layer takes its own path."""
    model = _q4k("tiny-qwen2")
    layer = model.model.layers[1]
    layer.mlp.down_proj = torch.nn.Linear(layer.mlp.down_proj.in_features, layer.mlp.down_proj.out_features)
    fused.fuse(model)
    _logits(model, list(range(3, 12)), [1, 2])
    assert model.model.__dict__["_native_stack"].native is None
    assert model.model.layers[0].plan().native is not None and layer.plan().native is None


def test_a_long_forward_runs_in_chunks_of_rows_with_a_trees_rows_last():
    assert fused.prefill_chunks(10, rows=4) == [(0, 4), (4, 8), (8, 10)]
    assert fused.prefill_chunks(8, rows=4) == [(0, 4), (4, 8)]
    assert fused.prefill_chunks(3, rows=4) == [(0, 3)]
    assert fused.prefill_chunks(10, masked=3, rows=4) == [(0, 4), (4, 10)]  # the tree's 3 rows together
    assert fused.prefill_chunks(10, masked=10, rows=4) == [(0, 10)]
    assert fused.prefill_chunks(1) == [(0, 1)]


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@pytest.mark.parametrize("build", [_w8af32_fused, _q4k], ids=["one-call-a-step", "two-calls-on-k-quants"])
def test_a_prompt_in_chunks_of_rows_is_the_prompt_in_one_call_bit_for_bit(ext, monkeypatch, name, build):
    """A long forward runs through the stack a chunk of rows at a time: every row's output and the
    cache are those of the whole forward at once; and a token tree's rows after a prompt (a first
    round's verification) are each its path's one-token step, however the prompt was cut."""
    from transformers import DynamicCache

    from harness.decoding import trees

    model = build(name)
    prompt = list(range(3, 26))
    nodes, tokens = ((0,), (1,), (0, 0)), {(0,): 40, (1,): 41, (0, 0): 42}

    def forward(ids: list[int], positions: list[int], mask=None, cache=None):
        cache = DynamicCache() if cache is None else cache
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([ids]),
                position_ids=torch.tensor([positions]),
                past_key_values=cache,
                use_cache=True,
                tree_mask=mask,
            )
        return out.logits[0], cache

    n = len(prompt)
    whole, whole_cache = forward(prompt, list(range(n)))
    steps = {}  # each node's row as a one-token step along its path
    for node in nodes:
        _, cache = forward(prompt, list(range(n)))
        for depth in range(1, len(node) + 1):
            logits, cache = forward([tokens[node[:depth]]], [n - 1 + depth], cache=cache)
        steps[node] = logits[-1]
    for rows in (1000, 4, 7):
        monkeypatch.setattr(fused, "PREFILL_ROWS", rows)
        logits, cache = forward(prompt, list(range(n)))
        assert torch.equal(logits, whole), rows
        for a, b in zip(cache.layers, whole_cache.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), rows
        ids = prompt + [tokens[p] for p in nodes]
        positions = list(range(n)) + [n - 1 + len(p) for p in nodes]
        logits, _ = forward(ids, positions, trees.verify_mask(nodes))
        assert torch.equal(logits[:n], whole), rows
        for i, node in enumerate(nodes):
            assert torch.equal(logits[n + i], steps[node]), (rows, node)


def test_what_the_loop_does_not_reproduce_takes_the_stacks_own_forward(ext, monkeypatch):
    """A padding mask, no cache, input embeddings, hidden states asked for: the stack's own forward
    (each layer's forward called), with what was asked for (batches: see above)."""
    from transformers import DynamicCache

    model = _q4k("tiny-qwen2")
    calls = _count_layer_forwards(monkeypatch, model)
    ids = torch.tensor([list(range(3, 12))])
    n = model.config.num_hidden_layers
    with torch.inference_mode():
        model(ids, attention_mask=torch.ones_like(ids), past_key_values=DynamicCache())
        assert calls == []  # an all-ones mask masks nothing: the loop
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        model(ids, attention_mask=mask, past_key_values=DynamicCache())
        model(ids, use_cache=False)
        model(inputs_embeds=model.model.embed_tokens(ids), past_key_values=DynamicCache())
        assert len(calls) == 3 * n
        out = model(ids, past_key_values=DynamicCache(), output_hidden_states=True)
        assert len(out.hidden_states) == n + 1 and len(calls) == 4 * n
        # transformers' capture hooks now sit on the layers: the loop stands aside from then on
        model(ids, past_key_values=DynamicCache())
        assert len(calls) == 5 * n


def test_a_kernel_library_cut_since_its_build_is_linked_again_not_loaded(tmp_path):
    """Loading a cut shared library ends the process with a bus error, past any handling: a library
    that is not the one its build recorded is deleted before the loader looks, so it links anew."""
    import json

    from harness.base import files
    from harness.kernels import cppext

    library = tmp_path / "k.so"
    library.write_bytes(b"\x7fELF" + bytes(4096))
    (tmp_path / cppext._BUILT).write_text(json.dumps({"files": files.record(tmp_path, [library.name])}))
    cppext._drop_if_damaged(library)
    assert library.is_file()  # as built: kept
    library.write_bytes(library.read_bytes()[:1000])
    cppext._drop_if_damaged(library)
    assert not library.exists() and not (tmp_path / cppext._BUILT).exists()
    library.write_bytes(b"\x7fELF")  # a library no build recorded
    cppext._drop_if_damaged(library)
    assert not library.exists()


@pytest.mark.parametrize("name", FUSABLE_FAMILIES)
@pytest.mark.parametrize("build", [_w8af32_fused, _q4k], ids=["one-call-a-step", "two-calls-on-k-quants"])
def test_the_stacks_final_norm_runs_on_the_row_wise_kernel(ext, name, build):
    """Fusing a stack puts its final norm on the row-wise kernel, from the module its layers run on
    (the two-call layers' on k-quant blocks): each row the kernel's, whichever module and however
    many rows a call holds, and transformers' own norm up to rounding; other dtypes take the
    module's own forward."""
    model = build(name)
    norm = model.model.norm
    assert isinstance(norm, fused.FusedNorm)
    assert norm._on_kquants == (build is _q4k)
    own = type(norm).__bases__[1].forward
    torch.manual_seed(0)
    x = torch.randn(1, 5, norm.weight.shape[0]) * 3
    with torch.inference_mode():
        got = norm(x)
        rows = ext.rms_norm(x[0], norm.weight, norm.variance_epsilon)
        assert got.shape == x.shape and torch.equal(got[0], rows)
        assert torch.equal(fused.extension().rms_norm(x[0], norm.weight, norm.variance_epsilon), rows)
        assert torch.equal(torch.cat([norm(x[:, i : i + 1]) for i in range(5)], dim=1), got)
        torch.testing.assert_close(got, own(norm, x), rtol=1e-6, atol=1e-6)
        half = x.bfloat16()
        assert torch.equal(norm(half), own(norm, half))


def test_fusing_again_follows_the_layers_kernels(ext):
    """A stack fused again after its layers' weights moved off k-quant blocks runs its norm on the
    row-wise steps' module, which every such layer runs on."""
    model = _q4k("tiny-qwen2")
    assert model.model.norm._on_kquants
    mlp = model.model.layers[0].mlp
    mlp.down_proj = torch.nn.Linear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False)
    fused.fuse(model)
    assert isinstance(model.model.norm, fused.FusedNorm) and not model.model.norm._on_kquants
