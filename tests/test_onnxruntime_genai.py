"""onnxruntime-genai's own speculative decoding under test: its assisted output equals its plain
output, the target as its own draft accepts everything, and its statistics agree with its tokens."""

from __future__ import annotations

import pytest

from harness.base.backends import OrtSettings
from harness.base.errors import HarnessError
from harness.decoding import genai
from harness.settings.setup import Target
from harness.theory.analysis import engine_stats_problems
from harness.weights import onnx_export, tiny

FP32 = OrtSettings("fp32")
PROMPTS = [[1, 50, 60, 70, 80, 90], [1, 7, 7, 7, 7, 7, 7, 7, 7, 7], [1, 200, 300, 400, 5, 6, 7, 300, 400]]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """tiny-qwen2's target and draft, each exported by the model builder into a private cache."""
    root = tmp_path_factory.mktemp("genai")
    target = tiny.build_target("tiny-qwen2")
    tokenizer = tiny.build_tokenizer()
    draft = tiny.build_draft("tiny-qwen2", target)
    t_src = tiny.saved_folder("tiny-qwen2", target, tokenizer, root=str(root / "hf"))
    d_src = tiny.saved_folder("tiny-qwen2-draft", draft, tokenizer, root=str(root / "hf"))
    cache = root / "cache"
    return (
        onnx_export.export("tiny-qwen2", t_src, FP32, cache=cache),
        onnx_export.export("tiny-qwen2-draft", d_src, FP32, cache=cache),
        root,
    )


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_target_as_its_own_draft_accepts_everything(exports, k):
    target, _, root = exports
    plain = genai.load(target)
    spec = genai.load(genai.speculative_folder(target, target, k, root / "spec"))
    for prompt in PROMPTS:
        want = genai.decode_prompt(plain, prompt, 24)
        got = genai.decode_prompt(spec, prompt, 24)
        assert got.output_ids == want.output_ids
        assert got.stats["acceptance_rate"] == 1.0 and got.stats["draft_tokens_accepted"] > 0
        assert engine_stats_problems(got.stats, len(got.output_ids), k) == []
        assert want.stats["rounds"] == 0  # plain decoding speculates nothing


@pytest.mark.parametrize("k", [2, 4])
def test_a_partial_draft_changes_nothing_and_the_engine_counts_truthfully(exports, k):
    target, draft, root = exports
    plain = genai.load(target)
    spec = genai.load(genai.speculative_folder(target, draft, k, root / "spec"))
    rates = []
    for prompt in PROMPTS:
        want = genai.decode_prompt(plain, prompt, 32)
        got = genai.decode_prompt(spec, prompt, 32)
        assert got.output_ids == want.output_ids, (prompt, want.output_ids, got.output_ids)
        assert engine_stats_problems(got.stats, len(got.output_ids), k) == [], got.stats
        rates.append(got.stats["acceptance_rate"])
        # Each verification's own drafted and accepted, read off the engine's counters as it went:
        # they add up to its totals.
        got_rounds = genai.decode_prompt(spec, prompt, 32, rounds=True)
        assert got_rounds.output_ids == want.output_ids
        assert len(got_rounds.rounds) == got_rounds.stats["target_verify_forward_passes"]
        assert sum(d for d, _ in got_rounds.rounds) == got_rounds.stats["draft_tokens_evaluated"]
        assert sum(a for _, a in got_rounds.rounds) == got_rounds.stats["draft_tokens_accepted"]
        assert all(0 <= a <= d <= k for d, a in got_rounds.rounds)
    assert 0.0 < min(rates) and max(rates) < 1.0  # partial: neither everything nor nothing


@pytest.mark.parametrize("k", [2, 5])
def test_the_engines_ngram_decoding_changes_nothing_and_counts_truthfully(exports, k):
    """The engine's n-gram decoding (the suite's prompt lookup): proposals looked up in the prompt
    and the output; greedy output equal to plain; steps with no match decode the plain way, and the
    statistics add up to the output with them."""
    target, _, root = exports
    plain = genai.load(target)
    ngram = genai.load(genai.speculative_folder(target, None, k, root / "spec", ngram_size=genai.NGRAM_SIZE))
    lookups = 0
    for prompt in PROMPTS:
        want = genai.decode_prompt(plain, prompt, 32)
        got = genai.decode_prompt(ngram, prompt, 32)
        assert got.output_ids == want.output_ids, (prompt, want.output_ids, got.output_ids)
        assert engine_stats_problems(got.stats, len(got.output_ids), k) == [], got.stats
        assert got.stats["draft_forward_passes"] == 0  # no draft model: proposals cost no forward
        lookups += got.stats["ngram_lookup_hits"]
    assert lookups > 0  # the repeated tokens of the prompts were found and proposed


def test_ngram_and_draft_model_speculation_are_one_or_the_other(exports, tmp_path):
    target, draft, _ = exports
    with pytest.raises(HarnessError, match="one of them"):
        genai.speculative_folder(target, draft, 3, tmp_path, ngram_size=2)
    with pytest.raises(HarnessError, match="one of them"):
        genai.speculative_folder(target, None, 3, tmp_path)
    with pytest.raises(HarnessError, match="takes 2 or more"):
        genai.speculative_folder(target, None, 3, tmp_path, ngram_size=1)


def test_a_k_the_engine_refuses_is_a_clear_error(exports, tmp_path):
    target, draft, _ = exports
    for k in (0, genai.MAX_K + 1):
        with pytest.raises(HarnessError, match="max_draft_tokens takes 1 to"):
            genai.speculative_folder(target, draft, k, tmp_path)


def test_a_missing_draft_export_is_a_clear_error(exports, tmp_path):
    target, _, _ = exports
    with pytest.raises(HarnessError, match="export it with the model builder"):
        genai.speculative_folder(target, tmp_path / "nothing", 3, tmp_path)


@pytest.mark.parametrize(
    ("lie", "expected"),
    [
        ({"tokens_emitted": 31}, "the output holds 32"),
        ({"standard_fallback_steps": 1}, "the output holds 32"),
        ({"acceptance_rate": 0.5}, "accepted / evaluated"),
        ({"bonus_tokens": 0}, "one each expected"),
        ({"draft_tokens_proposed": 10_000}, "more than K"),
        ({"mean_emitted_tokens_per_round": 9.0}, "emitted / rounds"),
        ({"expected_tokens_per_round": 9.0}, "at its acceptance rate"),
    ],
)
def test_statistics_that_disagree_with_the_tokens_are_caught(exports, lie, expected):
    target, draft, root = exports
    run = genai.decode_prompt(
        genai.load(genai.speculative_folder(target, draft, 2, root / "spec")), PROMPTS[0], 32
    )
    assert engine_stats_problems(run.stats, len(run.output_ids), 2) == []
    run.stats.update(lie)
    assert any(expected in problem for problem in engine_stats_problems(run.stats, len(run.output_ids), 2))


def test_the_engines_speedup_figures_are_what_its_own_books_give(exports, tmp_path):
    """With adaptive K the engine times plain steps of its own and reports an observed and an
    estimated speedup: both must follow from its times and counts, and a wrong one is caught."""
    import json
    import shutil

    target, draft, root = exports
    folder = tmp_path / "adaptive"
    shutil.copytree(genai.speculative_folder(target, draft, 3, root / "spec"), folder, symlinks=True)
    config = json.loads((folder / "genai_config.json").read_text())
    config["speculative"]["min_adaptive_k"] = 1
    (folder / "genai_config.json").write_text(json.dumps(config))
    run = genai.decode_prompt(genai.load(folder), PROMPTS[0], 64)
    s = run.stats
    assert s["target_baseline_ms_per_token"] > 0 and s["observed_speedup"] > 0 and s["estimated_speedup"] > 0
    assert engine_stats_problems(s, len(run.output_ids), 3) == []
    for lie in ("observed_speedup", "estimated_speedup"):
        told = dict(s, **{lie: s[lie] * 1.5})
        assert any(lie in problem for problem in engine_stats_problems(told, len(run.output_ids), 3))


@pytest.mark.real
@pytest.mark.slow
def test_the_offline_pair_speculates_exactly_in_the_engine(pairs):
    """The offline pair exported by the model builder (int4, as the ONNX Runtime target), its 0.5B
    draft beside it, and the engine's n-gram decoding: on HumanEval prompts each speculative output
    equals the engine's plain output, or leaves it only at a near tie of the engine's own logits; its
    statistics agree with its tokens."""
    from transformers import AutoTokenizer

    from harness.experiments import humaneval
    from harness.pairs import models
    from harness.weights import packaged

    spec = models.get_pair(models.DEFAULT_PAIR)
    pairs.require_weights(spec.name)
    roles = (spec.target, spec.draft)
    folders = [models.resolve_model(m) for m in roles]
    t_exp, d_exp = (
        models.export_ort_target(m.name, f, OrtSettings()) for m, f in zip(roles, folders, strict=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(folders[0])
    plain = genai.load(t_exp)
    speculative = genai.load(genai.speculative_folder(t_exp, d_exp, 3, packaged.cache_root() / "genai"))
    ngram = genai.load(
        genai.speculative_folder(t_exp, None, 5, packaged.cache_root() / "genai", ngram_size=genai.NGRAM_SIZE)
    )
    tolerance = genai.GenaiEngine.near_tie_tolerance(Target(OrtSettings().label, backend="onnxruntime"))
    for prompt in humaneval.prompts(3, 64, tokenizer):
        want = genai.decode_prompt(plain, prompt.input_ids, 64)
        for model, k in ((speculative, 3), (ngram, 5)):
            got = genai.decode_prompt(model, prompt.input_ids, 64)
            # Identical, or the first flip a near tie by the engine's own one-token logits (its wide
            # verification forward is not bit-identical to a one-token step: its documented caveat).
            flip = genai.divergence_gap(plain, prompt.input_ids, want.output_ids, got.output_ids)
            assert flip is None or 0 <= flip[1] <= tolerance, (prompt.label, k, flip)
            assert engine_stats_problems(got.stats, len(got.output_ids), k) == [], got.stats
            assert got.stats["draft_tokens_accepted"] > 0


def test_the_cli_runs_the_engines_ngram_decoding_as_prompt_lookup(tmp_path, capsys):
    import json

    from harness import cli

    rows_path = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--engine", "onnxruntime-genai", "--compare",
            "--prompt_lookup", "4", "--limit", "2", "--max_new_tokens", "16", "--no_progress",
            "--json", str(rows_path)]  # fmt: skip
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    plain = {r["example"]: r["output_ids"] for r in rows if r["mode"] == "plain"}
    lookup = [r for r in rows if r["mode"] == "prompt_lookup"]
    assert len(lookup) == 2 and all(r["output_ids"] == plain[r["example"]] for r in lookup)
    assert {r["engine"] for r in rows} == {"onnxruntime-genai"}
    assert all(r["draft_forwards"] == 0 for r in lookup)


def test_the_cli_runs_the_engine_and_its_rows_say_so(tmp_path, capsys):
    import json
    import shlex

    from harness import cli
    from harness.pairs import models
    from harness.settings import setup

    rows_path = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--engine", "onnxruntime-genai", "--compare", "--limit", "2",
            "--max_new_tokens", "16", "--no_progress", "--json", str(rows_path)]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert {r["engine"] for r in rows} == {"onnxruntime-genai"} and len(rows) == 4
    plain = {r["example"]: r["output_ids"] for r in rows if r["mode"] == "plain"}
    assisted = [r for r in rows if r["mode"] == "assisted"]
    assert all(r["output_ids"] == plain[r["example"]] and r["drafted"] > 0 for r in assisted)
    command = setup.command(assisted[0], setup.defaults(models.get_pair("tiny-qwen2")))
    # Printed as the invocation that made the rows: the row's settings, the modes, the budget, the file.
    printed = command.replace(" --assisted_generation", "") + " --compare --limit 2 --max_new_tokens 16"
    assert printed in out, out
    args = cli.build_parser().parse_args(shlex.split(printed)[2:])
    assert args.engine == "onnxruntime-genai" and args.compare


def test_the_cli_samples_through_the_engine_reproducibly_by_seed(tmp_path):
    """Sampled speculative decoding runs through the engine's own sampler: the same seed gives the
    same tokens, and the rows say the run sampled."""
    import json

    from harness import cli

    def run(seed: int, name: str) -> list[dict]:
        rows_path = tmp_path / name
        argv = ["--model_name", "tiny-qwen2", "--engine", "onnxruntime-genai", "--assisted_generation",
                "--do_sample", "--temperature", "0.8", "--seed", str(seed), "--limit", "2",
                "--max_new_tokens", "12", "--no_progress", "--json", str(rows_path)]  # fmt: skip
        assert cli.main(argv) == 0
        return [json.loads(line) for line in rows_path.read_text().splitlines()]

    first, again, other = run(5, "a.jsonl"), run(5, "b.jsonl"), run(6, "c.jsonl")
    assert all(r["do_sample"] and r["engine"] == "onnxruntime-genai" and r["drafted"] > 0 for r in first)
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]
    assert [r["output_ids"] for r in first] != [r["output_ids"] for r in other]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--prompt_lookup", "40"], "max_draft_tokens takes 1 to"),
        (["--assisted_generation", "--draft_vocab", "100"], "--draft_vocab applies to --engine transformers"),
        (["--assisted_generation", "--num_assistant_tokens", "40"], "max_draft_tokens takes 1 to"),
    ],
)
def test_what_the_engine_does_not_take_is_refused_before_loading(capsys, extra, expected):
    from harness import cli

    argv = ["--model_name", "tiny-qwen2", "--engine", "onnxruntime-genai", "--limit", "1", "--no_progress"]
    assert cli.main([*argv, *extra]) == cli.EXIT_USAGE
    assert expected in capsys.readouterr().err


def test_the_engine_stops_where_a_stop_string_appears_in_both_modes():
    """The library has no stop strings; the engine ends a decode at the token that completes one
    (HumanEval's completions end there instead of running to the budget)."""
    from harness.decoding import engines
    from harness.pairs import models
    from harness.settings.setup import GenerationSettings

    spec = models.get_pair("tiny-qwen2")
    pair = engines.load(spec, engines.resolve(spec, engine="onnxruntime-genai"))
    prompt = PROMPTS[0]
    full = pair.engine.decode(pair, prompt, GenerationSettings(max_new_tokens=24, ignore_eos=True)).output_ids
    stop = pair.tokenizer.decode(full[8:10])
    end = next(i for i in range(len(full)) if stop in pair.tokenizer.decode(full[: i + 1]))
    for mode in ("plain", "assisted"):
        settings = GenerationSettings(
            mode=mode, num_assistant_tokens=3, max_new_tokens=24, ignore_eos=True, stop_strings=(stop,)
        )
        out = pair.engine.decode(pair, prompt, settings).output_ids
        assert out == full[: end + 1] and end + 1 < len(full), (mode, out, full)


def test_the_model_builders_own_output_folders_run_as_they_were_made(tmp_path, capsys):
    """A user's exports (the model builder's output folders: genai_config.json, the graph and the
    tokenizer) run under the engine as they are, named in the rows; another engine refuses them in
    one line saying which runs them."""
    from harness import cli
    from harness.pairs import models
    from harness.settings.results import read_rows

    recipe = "tiny-qwen2"
    target = tiny.build_target(recipe)
    draft = tiny.build_draft(recipe, target)
    tokenizer = tiny.build_tokenizer()
    folders = {
        role: tiny.saved_folder(f"mine-{role}", model, tokenizer, str(tmp_path))
        for role, model in (("target", target), ("draft", draft))
    }
    exports = {
        role: models.export_ort_target(role, folder, OrtSettings()) for role, folder in folders.items()
    }
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--engine", "onnxruntime-genai", "--model_name_or_path", str(exports["target"]),
            "--assistant_model", str(exports["draft"]), "--compare", "--limit", "1", "--max_new_tokens", "16",
            "--json",
            str(rows_path), "--no_progress"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    rows = {r.mode: r for r in read_rows(rows_path)}
    assert set(rows) == {"plain", "assisted"} and rows["assisted"].drafted > 0
    assert rows["plain"].target_precision == "ort-export" and rows["plain"].engine == "onnxruntime-genai"
    assert rows["plain"].output_ids == rows["assisted"].output_ids
    capsys.readouterr()
    assert cli.main([a for a in argv if a not in ("--engine", "onnxruntime-genai")]) == 2
    err = capsys.readouterr().err
    assert "is an onnxruntime-genai export" in err and "--engine onnxruntime-genai" in err
    assert "Traceback" not in err
