"""Assisted output is the target's own output.

Greedy: token-exact for every registered pair whose weights are here, every draft strategy (the
registered draft, the target itself, a random model, a truncated target, prompt lookup), K in
{1, 2, 5, 8}, constant and dynamic schedules, with and without an EOS inside the budget. Every case
also asserts that drafting happened, so none passes vacuously. Sampling: the assisted token
distribution is the target's, by a chi-square test with a stated false-alarm rate.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from harness.base import categories, tasks
from harness.base.backends import OrtSettings
from harness.base.devices import device_of, place
from harness.base.errors import UnsupportedError
from harness.decoding import engines, strategies
from harness.decoding.generation import generate, generation_config
from harness.experiments import bench, equivalence
from harness.pairs.models import LoadedPair, get_pair, load_ort_target
from harness.settings import setup
from harness.settings.setup import Draft, GenerationSettings, Target
from harness.suite import DEFAULT_DEVICES
from harness.weights import tiny

KS = (1, 2, 5, 8)
SCHEDULES = ("constant", "dynamic")
TINY_NEW_TOKENS = 16
REAL_NEW_TOKENS = 16


def _grid() -> list:
    """Every draft strategy gets the full cross of K x schedule x EOS. Prompt lookup has no draft
    model, hence no confidence schedule: its K is the lookup length, crossed with EOS."""
    cases = [
        (strategy, k, sched, eos)
        for strategy in ("draft", "self", "random", "partial")
        for k in KS
        for sched in SCHEDULES
        for eos in (False, True)
    ]
    cases += [("prompt_lookup", k, "constant", eos) for k in KS for eos in (False, True)]
    return [pytest.param(*c, id=f"{c[0]}-K{c[1]}-{c[2]}-{'eos' if c[3] else 'noeos'}") for c in cases]


GRID = _grid()


# The decode and code prompts alternating, so a short run still covers both.
PROMPTS = tasks.decode_prompts("mixed")


@pytest.fixture(scope="session")
def equality() -> equivalence.EqualityRuns:
    """Plain outputs computed once per session (they depend on neither K nor the draft)."""
    return equivalence.EqualityRuns()


@pytest.mark.pairs(real=False)
@pytest.mark.parametrize("strategy,k,schedule,eos", GRID)
def test_greedy_equivalence(pairs, equality, pair_name, target_backend, strategy, k, schedule, eos, request):
    pair = pairs.get(pair_name, target_backend=target_backend)
    # Two prompts per case, rotating through decode and code prompts across the grid.
    first = zlib.crc32(request.node.callspec.id.encode()) % len(PROMPTS)
    prompts = [PROMPTS[first], PROMPTS[(first + 1) % len(PROMPTS)]]
    s = strategies.get(strategy).settings(k, schedule, TINY_NEW_TOKENS)
    # Byte-level tiny tokenizer: 64 tokens keep the prompt's start (signature or question) and the
    # case fast; real pairs see whole prompts.
    cases = [equality.case(pair, p.text, strategy, s, eos_inside=eos, max_prompt_tokens=64) for p in prompts]
    assert equivalence.acceptance_problems(cases, strategy, eos=eos) == []


@pytest.mark.pairs(tiny=False)
@pytest.mark.parametrize("strategy", equivalence.STRATEGIES)
@pytest.mark.parametrize(
    "k,schedule,eos",
    [
        pytest.param(5, "constant", False, id="K5-constant-noeos"),
        pytest.param(2, "dynamic", True, id="K2-dynamic-eos"),
    ],
)
def test_greedy_equivalence_real(
    pairs, equality, pair_name, target_backend, tier_prompts, strategy, k, schedule, eos
):
    pair = pairs.get(pair_name, target_backend=target_backend)
    s = strategies.get(strategy).settings(k, schedule, REAL_NEW_TOKENS)
    cases = [equality.case(pair, p.text, strategy, s, eos_inside=eos) for p in tier_prompts]
    assert equivalence.acceptance_problems(cases, strategy, eos=eos) == []


# --------------------------------------------------------------------------- property tests


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_property_assisted_equals_plain(pairs, name):
    pair = pairs.get(name)
    vocab = min(pair.target.config.vocab_size, 300)

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        ids=st.lists(st.integers(3, vocab - 1), min_size=1, max_size=24),
        k=st.integers(1, 8),
        max_new=st.integers(1, 12),
        min_frac=st.floats(0, 1),
        lookup=st.booleans(),
    )
    def check(ids, k, max_new, min_frac, lookup):
        s = GenerationSettings(
            mode="prompt_lookup" if lookup else "assisted",
            num_assistant_tokens=k,
            prompt_lookup_num_tokens=k,
            max_new_tokens=max_new,
            min_new_tokens=int(min_frac * max_new),
        )
        case = equivalence.check_case(pair, ids, s)
        assert case.identical, case.explain()
        assert len(case.assisted.output_ids) == len(case.plain.output_ids)
        assert s.min_new_tokens <= len(case.plain.output_ids) <= max_new

    check()


# --------------------------------------------------------------------------- the suite catches bugs


def _accept_one_extra(module, args, kwargs, output):
    """A broken verifier: at the first rejected candidate of each verify step, accept it anyway."""
    ids = kwargs.get("input_ids")
    cache = kwargs.get("past_key_values")
    if ids is None or ids.shape[1] < 2 or cache is None or cache.get_seq_length() == 0:
        return output
    logits = output.logits.clone()
    for t in range(ids.shape[1] - 1):
        wanted = int(ids[0, t + 1])
        if int(logits[0, t].argmax()) != wanted:
            logits[0, t, wanted] = logits[0, t].max() + 10.0
            break
    output.logits = logits
    return output


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_broken_verifier_is_caught(pairs, equality, name):
    pair = pairs.get(name)
    broken = strategies.get("random").draft(pair)
    s = strategies.get("draft").settings(5, "constant", TINY_NEW_TOKENS)
    honest = equality.case(broken, PROMPTS[0].text, "draft", s)
    assert honest.identical, honest.explain()
    handle = pair.target.register_forward_hook(_accept_one_extra, with_kwargs=True)
    try:
        case = equality.case(broken, PROMPTS[0].text, "draft", s)
    finally:
        handle.remove()
    assert case.assisted.accepted > 0, "the broken verifier accepted nothing: the test did not bite"
    assert not case.acceptable, "a verifier that accepts a wrong draft token went unnoticed"
    assert equivalence.acceptance_problems([case], "draft")


# --------------------------------------------------------------------------- sampling

SAMPLE_RECIPE = tiny.TinyRecipe(
    "llama",
    vocab_size=12,
    draft_vocab_size=12,
    hidden=32,
    layers=2,
    draft_layers=1,
    heads=2,  # head size 16: ONNX Runtime's GroupQueryAttention takes multiples of 16
    seed=23,  # both speculative-sampling branches run at temp 0.1 (seed 21 with 2 heads: always accepted)
    init_std=0.5,
    tail_scale=1.0,
    draft_noise=0.1,
)
SAMPLE_SEEDS = 400
SAMPLE_POSITIONS = (0, 1, 2)
# Per-position chi-square tests at this level; with 3 positions x 3 settings = 9 tests the
# family-wise false-alarm rate of the suite is at most 9 x 0.001 < 1% (Bonferroni).
ALPHA = 0.001

SAMPLING = {
    "temp1.0": dict(temperature=1.0),
    "temp0.1-top_p0.95": dict(temperature=0.1, top_p=0.95),
    "top_k4": dict(temperature=1.0, top_k=4),
}


@pytest.fixture(scope="module")
def sampling_pair(
    sampling_engine, selected_target_backends, run_devices, tmp_path_factory
) -> Iterator[LoadedPair]:
    """The sampling pair on ``sampling_engine`` (the plugin's axis): its target in torch, or exported
    to ONNX Runtime (int4, the backend's default precision) with the same torch draft, in
    transformers' loop; or both models as an engine runs them (``Engine.from_models``: the builder's
    exports, GGUF files), whose own speculative sampling then runs them (its servers stop when the
    module's tests end)."""
    target = tiny.build_target(SAMPLE_RECIPE)
    draft = tiny.build_draft(SAMPLE_RECIPE, target)
    tokenizer = tiny.build_tokenizer()
    spec = get_pair("tiny-llama")
    if sampling_engine == "torch":
        # On the session's devices (--target-device, --draft-device): a GPU's own random streams
        # must still give the target's distribution.
        on_target, on_draft = run_devices
        yield LoadedPair(
            spec,
            place(target, on_target),
            place(draft, on_draft),
            tokenizer,
            Target("fp32", device=on_target),
            Draft("fp32", device=on_draft),
        )
        return
    if run_devices != DEFAULT_DEVICES:
        pytest.skip(
            f"the {sampling_engine} target places its own models; --target-device is transformers' loop's"
        )
    pair = LoadedPair(spec, target, draft, tokenizer, Target("fp32"), Draft("fp32"))
    provider = dict(selected_target_backends).get("onnxruntime")
    if sampling_engine != "onnxruntime":
        run = engines.resolve(spec, engine=sampling_engine, provider=provider)
        built = engines.engine_class(sampling_engine).from_models(
            spec, run, target, draft, tokenizer, tmp_path_factory.mktemp("sampling")
        )
        try:
            yield built
        finally:
            built.engine.close()
        return
    settings = OrtSettings(provider=provider).validate()
    exported = load_ort_target(
        "tiny-sampling", tiny.saved_folder("tiny-sampling", target, tokenizer), settings
    )
    exported.generation_config = target.generation_config
    yield dataclasses.replace(
        pair,
        target=exported,
        target_setup=Target(settings.label, backend="onnxruntime", provider=settings.provider),
    )


SAMPLE_PROMPT = [1, 5, 7]


def _sample_tokens(pair: LoadedPair, s: GenerationSettings, seeds: range) -> tuple[np.ndarray, int, int]:
    """Assisted tokens at SAMPLE_POSITIONS for each seed, plus total accepted and drafted tokens.
    (transformers' assisted generation takes one sequence per call, so one call per seed.)"""
    out = np.empty((len(seeds), len(SAMPLE_POSITIONS)), dtype=np.int64)
    accepted = drafted = 0
    for row, seed in enumerate(seeds):
        m = generate(pair, SAMPLE_PROMPT, dataclasses.replace(s, seed=seed))
        out[row] = [m.output_ids[p] for p in SAMPLE_POSITIONS]
        accepted, drafted = accepted + m.accepted, drafted + m.drafted
    return out, accepted, drafted


def _sample_plain(pair: LoadedPair, s: GenerationSettings, n: int, seed: int) -> np.ndarray:
    """The target's own samples: n independent rows of one batched ``generate`` call (each row draws
    its own multinomial samples), n times cheaper than n calls and the same distribution. An
    engine's pair (no torch target) samples one seed per call, as its speculative runs do."""
    if pair.target is None:
        return _sample_tokens(pair, s, range(seed * n, seed * n + n))[0]
    ids = torch.tensor([SAMPLE_PROMPT] * n, device=device_of(pair.target))
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = pair.target.generate(
            ids, attention_mask=torch.ones_like(ids), generation_config=generation_config(s, pair)
        )
    return out[:, len(SAMPLE_PROMPT) :].cpu().numpy()[:, list(SAMPLE_POSITIONS)]


@pytest.fixture(scope="module")
def plain_samples(sampling_pair) -> dict[str, np.ndarray]:
    """Plain samples per sampling setting, drawn once per module (the misreported-draft test reuses
    them)."""
    return {
        name: _sample_plain(sampling_pair, _sampling_settings("plain", kw), SAMPLE_SEEDS, seed=7)
        for name, kw in SAMPLING.items()
    }


def _distribution_p_values(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Chi-square test of homogeneity per position (tokens seen in either sample as categories)."""
    p_values = []
    for col in range(a.shape[1]):
        cats = sorted(set(a[:, col]) | set(b[:, col]))
        table = np.array([[np.sum(x[:, col] == c) for c in cats] for x in (a, b)])
        if table.shape[1] < 2:
            p_values.append(1.0)  # both always chose the same token: identical distributions
            continue
        p_values.append(float(stats.chi2_contingency(table).pvalue))
    return p_values


def _sampling_settings(mode: str, kw: dict) -> GenerationSettings:
    return GenerationSettings(
        mode=mode,
        do_sample=True,
        num_assistant_tokens=3,
        ignore_eos=True,
        max_new_tokens=max(SAMPLE_POSITIONS) + 1,
        **kw,
    )


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_matches_target_distribution(sampling_pair, plain_samples, name):
    kw = SAMPLING[name]
    plain = plain_samples[name]
    assisted_s = _sampling_settings("assisted", kw)
    assisted, accepted, drafted = _sample_tokens(
        sampling_pair, assisted_s, range(10_000, 10_000 + SAMPLE_SEEDS)
    )
    # Both branches of speculative sampling (accept, and reject-then-resample) must have run.
    assert 0 < accepted < drafted, f"speculative sampling accepted {accepted}/{drafted}"
    p_values = _distribution_p_values(plain, assisted)
    assert min(p_values) > ALPHA, f"assisted sampling departs from the target's distribution: p={p_values}"


# transformers' loop only: the draft is patched where that loop calls it (the engine's draft runs
# inside its C++ library).
@pytest.mark.parametrize("sampling_engine", ["torch", "onnxruntime"], scope="module")
def test_sampling_test_catches_misreported_draft(sampling_pair, plain_samples, monkeypatch):
    """A draft that samples from one distribution but reports another (a known transformers bug
    class) biases speculative sampling; the distribution test must notice."""
    from transformers.generation import candidate_generator as cg

    real = cg.AssistedCandidateGenerator._generate_candidates

    def misreport(self, generation_args):
        ids, logits = real(self, generation_args)
        return ids, None if logits is None else logits * 3.0  # claims a much sharper q than it used

    kw = SAMPLING["temp1.0"]
    plain = plain_samples["temp1.0"]
    monkeypatch.setattr(cg.AssistedCandidateGenerator, "_generate_candidates", misreport)
    biased, _, _ = _sample_tokens(
        sampling_pair, _sampling_settings("assisted", kw), range(10_000, 10_000 + SAMPLE_SEEDS)
    )
    assert min(_distribution_p_values(plain, biased)) < ALPHA


def test_sampling_test_detects_a_changed_temperature(sampling_pair, plain_samples):
    """The test's power at this sample size, on every engine: the target's own samples at
    temperature 0.5 are told apart from its samples at 1.0 (a sampler that dropped or doubled the
    temperature would be caught)."""
    cooler = _sample_plain(
        sampling_pair, _sampling_settings("plain", dict(temperature=0.5)), SAMPLE_SEEDS, 11
    )
    assert min(_distribution_p_values(plain_samples["temp1.0"], cooler)) < ALPHA


# --------------------------------------------------------------------------- precision tiers

TIER_PRECISIONS = ("fp32", "bf16", "w8abf16", "w4abf16")
TIER_KERNELS = ("stock", "invariant")
# Every precision the harness offers on the invariant kernels; on stock kernels w8af32 is left out:
# its activation scale is shared by all rows of a call, so a verification row can differ from the
# decode step by more than a near tie (measured per op in the README), which is what the invariant
# path exists to fix.
TIERS = [(p, k) for p in TIER_PRECISIONS for k in TIER_KERNELS] + [("w8af32", "invariant")]
# q4k is a draft's precision (the real pair's target runs its GGUF's own blocks, ``gguf``); on the
# tiny models it checks the k-quant kernels at widths that are not a multiple of their 256-blocks.
TINY_TIERS = [*TIERS, ("q4k", "invariant")]


def _tier_check(
    pair: LoadedPair,
    prompts: list[tasks.Prompt],
    new_tokens: int,
    table,
    equality: equivalence.EqualityRuns,
    max_tokens=None,
    tree: str = "",
    context: int = 0,
):
    s = dataclasses.replace(
        strategies.get("draft").settings(5, "constant", new_tokens), draft_tree=tree, context_draft=context
    )
    t = pair.target_setup
    runtime = " ".join(filter(None, ("onnxruntime" if t.engine == "transformers" else t.engine, t.provider)))
    runs_on = t.kernels if t.backend == "torch" else runtime
    label = f"{pair.target_setup.precision} / {runs_on}" + (f" / tree {tree}" if tree else "")
    label += f" / context {context}" if context else ""
    done = table.recorded(label, pair.spec.name)  # --divergence-out of an interrupted run: resume
    cases = []
    for p in prompts:
        sha = setup.prompt_digest(p.text)
        if (p.label, sha) in done:
            row = done[p.label, sha]
            table.add_recorded(label, row)
            assert row["identical"] or (row["near_tie"] and pair.target_setup.kernels != "invariant"), row
            continue
        # Counted (and written, with --divergence-out) as each prompt finishes, not at the end.
        cases.append(equality.case(pair, p.text, "draft", s, max_prompt_tokens=max_tokens))
        table.add(label, cases[-1], p.label, pair.spec.name, sha)
    for case in cases:
        # fp32 must be token-exact; lower precisions on stock kernels may flip only a near-tied
        # argmax; on the batch-invariant kernels every precision must be token-exact.
        assert case.acceptable, f"{pair.target_setup.precision}/{pair.target_setup.kernels}: {case.explain()}"
        if pair.target_setup.kernels == "invariant":
            assert case.identical, case.explain()
    assert not cases or sum(c.assisted.drafted for c in cases) > 0


@pytest.mark.pairs(real=False)
@pytest.mark.parametrize("target_precision,kernels", TINY_TIERS)
def test_precision_tier(pairs, equality, divergence_table, pair_name, target_precision, kernels):
    pair = pairs.get(pair_name, target_precision=target_precision, target_kernels=kernels)
    _tier_check(pair, PROMPTS[:4], TINY_NEW_TOKENS, divergence_table, equality, 64)


@pytest.mark.pairs(real=False)
@pytest.mark.backends("onnxruntime")
def test_precision_tier_onnxruntime(pairs, equality, divergence_table, pair_name, target_backend):
    """The ONNX Runtime target (int4) as a tier: third-party kernels, so near ties are allowed."""
    pair = pairs.get(pair_name, target_backend=target_backend)
    _tier_check(pair, PROMPTS[:4], TINY_NEW_TOKENS, divergence_table, equality, 64)


@pytest.mark.pairs(tiny=False)
@pytest.mark.backends("onnxruntime")
def test_precision_tier_real_onnxruntime(
    pairs, equality, divergence_table, pair_name, target_backend, tier_prompts
):
    pair = pairs.get(pair_name, target_backend=target_backend)
    _tier_check(pair, tier_prompts, REAL_NEW_TOKENS, divergence_table, equality)


# The tiny pair the engine axis runs its tiny tiers on: the offline pair's family.
ENGINE_TINY = ("tiny-qwen2",)


@pytest.mark.pairs(tiny=ENGINE_TINY)
def test_engine_tier(pairs, equality, divergence_table, pair_name, engine, tier_prompts):
    """An engine's own speculative decoding (its own draft) as a tier: every output the plain one, or
    its first flip a near tie by the engine's own plain judgement (``--real-prompts 186`` covers
    every prompt on a real pair)."""
    pair = pairs.get(pair_name, engine=engine)
    if pair.spec.target.is_tiny:
        _tier_check(pair, PROMPTS[:4], TINY_NEW_TOKENS, divergence_table, equality, 64)
    else:
        _tier_check(pair, tier_prompts, REAL_NEW_TOKENS, divergence_table, equality)


@pytest.mark.pairs(tiny=False)
@pytest.mark.engines(mode="prompt_lookup")
def test_engine_prompt_lookup_real(pairs, equality, pair_name, engine, tier_prompts):
    """An engine's n-gram speculation (the suite's prompt lookup) leaves its output unchanged, or
    flips only near ties, on a prompt that repeats itself (so the lookup proposes, and is checked)."""
    pair = pairs.get(pair_name, engine=engine, with_draft=False)
    s = strategies.get("prompt_lookup").settings(5, "constant", REAL_NEW_TOKENS)
    cases = [equality.case(pair, p.text, "prompt_lookup", s) for p in tier_prompts]
    assert equivalence.acceptance_problems(cases, "prompt_lookup") == []


@pytest.mark.pairs(tiny=False)
@pytest.mark.parametrize("target_precision,kernels", TIERS)
def test_precision_tier_real(
    pairs, equality, divergence_table, pair_name, tier_prompts, target_precision, kernels
):
    pair = pairs.get(pair_name, target_precision=target_precision, target_kernels=kernels)
    _tier_check(pair, tier_prompts, REAL_NEW_TOKENS, divergence_table, equality)


@pytest.mark.pairs(tiny=False)
def test_precision_tier_real_tree(pairs, equality, divergence_table, pair_name, tier_prompts):
    """The registered pair with the tree case's token tree (``bench.REAL_TREE``) in the harness's
    own loop: every prompt token-exact (each verified row is the one-token step on its path)."""
    pairs.require_weights(pair_name)
    pair = pairs.get(pair_name)
    if not setup.invariant_pair(pair.target_setup, pair.draft_setup):
        pytest.skip(f"{pair_name} is not registered on the batch-invariant kernels, which a tree needs")
    prompts = tier_prompts
    _tier_check(pair, prompts, REAL_NEW_TOKENS, divergence_table, equality, tree=bench.REAL_TREE)


@pytest.mark.pairs(tiny=False)
def test_precision_tier_real_context_categories(pairs, equality, divergence_table, pair_name):
    """The registered pair with proposals from the context (``--context_draft 16``) beside its draft,
    on the first prompt of every task category: every one token-exact, whatever share of its
    tokens the context proposed."""
    pairs.require_weights(pair_name)
    pair = pairs.get(pair_name)
    if not setup.invariant_pair(pair.target_setup, pair.draft_setup):
        pytest.skip(f"{pair_name} is not on the batch-invariant kernels, which context drafting needs")
    names = [c.name for c in categories.CATEGORIES]
    first = tasks.prompts_of(",".join(names), REAL_NEW_TOKENS)[: len(names)]  # one of each, in turn
    _tier_check(pair, first, REAL_NEW_TOKENS, divergence_table, equality, context=16)


@pytest.mark.pairs(tiny=False)
def test_precision_tier_real_gguf(pairs, equality, divergence_table, pair_name, tier_prompts):
    """The target on its GGUF file's own blocks (``gguf``): batch-invariant kernels, so every
    prompt must be token-exact."""
    pairs.require_weights(pair_name)
    try:
        pair = pairs.get(pair_name, target_precision="gguf", target_kernels="invariant")
    except UnsupportedError as exc:
        if "has none" not in str(exc):
            raise
        pytest.skip(f"{pair_name} has no GGUF file here, which the gguf precision reads")
    _tier_check(pair, tier_prompts, REAL_NEW_TOKENS, divergence_table, equality)
