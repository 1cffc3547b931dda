"""The results page: generated from the committed rows, current, every table headed by its machine,
versions and command."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import pytest_in_process

from harness import cli
from harness.report import page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def test_the_committed_page_is_what_the_committed_rows_generate():
    """Nothing on the page is typed by hand: regenerating it from the rows gives the same bytes
    (after new rows are committed, ``--regen-tables`` rewrites it)."""
    assert (RESULTS / page.PAGE_NAME).read_text(encoding="utf-8") == page.results_page(RESULTS)


def test_every_table_says_its_machine_versions_and_command():
    text = page.results_page(RESULTS)
    sections = re.split(r"^#### ", text, flags=re.MULTILINE)[1:]
    assert len(sections) >= 10
    for section in sections:
        head = section.split("\n\n|", 1)[0]
        assert "- machine: `" in head and "- versions: " in head and "- command" in head, head
        # A table, or the reason a run is not shown as a result.
        assert "\n|" in section or "Not shown as a result: " in section, (
            f"no table under {section.splitlines()[0]}"
        )


def test_a_disturbed_run_is_not_published_as_a_result():
    """The committed Xeon benchmark runs whose rounds of one prompt ran 3.9x and 18x apart are
    named and left out, with the reason, while the steady runs keep their tables."""
    text = page.results_page(RESULTS)
    sections = re.split(r"^#### ", text, flags=re.MULTILINE)[1:]
    left_out = [s for s in sections if "Not shown as a result: " in s]
    assert any("w8af32 target" in s.splitlines()[0] for s in left_out), left_out
    for section in left_out:
        assert "\n|" not in section and "the host was disturbed" in section and "x apart" in section
    steady = [s for s in sections if "benchmark:" in s.splitlines()[0] and "\n|" in s]
    assert len(steady) >= 4, steady


def test_the_page_shows_each_kind_of_result():
    text = page.results_page(RESULTS)
    # A sweep (speedup with its interval), the benchmark cases, divergence counts and HumanEval.
    assert re.search(r"\| t_gguf-d_q4k-K3-dynamic-invariant-dv16384-dk_invariant +\| +20 \|", text)
    assert "#### qwen2.5-coder-1.5b, benchmark: gguf target, q4k draft" in text
    assert "| gguf / invariant" in text and "#### HumanEval: qwen2.5-coder-1.5b-gguf-q4k" in text
    # The engine's draft-model configuration keeps the label the sweep gave it.
    assert "t_int4-d_int4-K3-constant-onnxruntime-genai" in text
    assert "#### Forward costs: qwen2.5-coder-1.5b target" in text and "| target  | llama.cpp" in text
    assert "#### Speed gate baselines" in text
    # A sweep measured on a host that recorded its CPU names the generation under its header.
    plan = text.split("rows/sweep/qwen2.5-coder-1.5b-context-plan-mixed-amd-epyc-2c-avx512.jsonl`", 1)[1]
    assert plan.lstrip().startswith("- CPU: family 25 model 17"), plan[:200]


def test_the_gate_baselines_are_the_measured_files(tmp_path):
    """Each measured baseline is a line with the file's own numbers; the seeds' imported tables
    (source "seed:...") are not measurements of this suite and stay off the page."""
    from harness.settings import baselines

    committed = ROOT / "baselines"
    record = next(
        r
        for r in baselines.platform_records(committed, "amd-epyc-2c-avx512")
        if "t_gguf-d_q4k" in r.case.case_id and r.case.draft_tree is None  # the registered chain's case
    )
    seed = baselines.platform_records(committed, "phx")[0]
    # One platform's storage holding a measured case and an imported one.
    for r in (record, seed):
        baselines.save_baseline(tmp_path / "baselines", "amd-epyc-2c-avx512", r.case, r)
    (tmp_path / "results").mkdir()
    text = page.results_page(tmp_path / "results")
    line = next(row for row in text.splitlines() if "q4k (invariant), vocab 16384, K=3 dynamic" in row)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:6] == [
        f"{record.tokens_per_s['plain']['mean']:.2f}",
        f"{record.tokens_per_s['assisted']['mean']:.2f}",
        f"{record.speedup['value']:.2f}x [{record.speedup['low']:.2f}-{record.speedup['high']:.2f}]",
    ]
    assert text.count("| qwen2.5-coder-1.5b ") == 1 and "seed" not in text


def test_regen_tables_writes_the_page_into_the_results_folder(tmp_path, capsys):
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    (copy / page.PAGE_NAME).unlink()
    assert cli.main(["--regen-tables", "--results_dir", str(copy)]) == 0
    assert str(copy / page.PAGE_NAME) in capsys.readouterr().out
    assert (copy / page.PAGE_NAME).read_text(encoding="utf-8") == page.results_page(copy)


def test_the_whole_page_builds_into_a_scratch_folder_leaving_results_untouched(tmp_path, capsys):
    """From the committed rows, into any folder: the page and every per-model table, and the
    committed results/ as it was."""

    def snapshot() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in RESULTS.rglob("*") if p.is_file()}

    before = snapshot()
    scratch = tmp_path / "scratch"
    assert cli.main(["--regen-tables", "--results_dir", str(scratch)]) == 0
    printed = capsys.readouterr().out
    assert (scratch / page.PAGE_NAME).read_text(encoding="utf-8") == page.results_page(RESULTS)
    committed = sorted(
        p.relative_to(RESULTS) for p in RESULTS.glob("*/*.md") if not p.name.startswith("sweep-")
    )
    assert committed and all((scratch / p).is_file() for p in committed)
    assert str(scratch / page.PAGE_NAME) in printed
    assert snapshot() == before


def test_given_rows_make_tables_and_a_page_of_their_own(tmp_path, capsys):
    rows = RESULTS / "rows" / "benchmark-amd-epyc-2c-avx512.jsonl"
    out = tmp_path / "mine"
    assert cli.main(["--regen-tables", "--rows", str(rows), "--results_dir", str(out)]) == 0
    text = (out / page.PAGE_NAME).read_text(encoding="utf-8")
    assert "## amd-epyc-2c-avx512" in text and "#### qwen2.5-coder-1.5b, benchmark:" in text
    assert (out / "amd-epyc-2c-avx512" / "qwen2.5-coder-1.5b.md").is_file()


def test_the_page_opens_with_the_summary_and_the_absolute_speed_plot():
    """What a reader came for comes first: per machine, the fastest exact configuration, its speedup
    over its own plain decoding, its ratio to llama.cpp's, HumanEval both ways, the engines side by
    side; and a plot of absolute tokens/s per configuration with llama.cpp as a reference line."""
    text = page.results_page(RESULTS)
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[0] == "Summary"
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for column in ("fastest exact configuration", "vs its plain", "vs llama.cpp plain", "HumanEval pass@1"):
        assert column in summary
    registered = next(line for line in summary.splitlines() if line.startswith("| `amd-epyc-2c-avx512`"))
    assert "t_gguf-d_q4k" in registered and re.search(r"\d\.\d\dx", registered) and "%" in registered
    # The fastest exact configuration as a command that runs it, not only its id.
    run = next(line for line in summary.splitlines() if line.startswith("- `amd-epyc-2c-avx512`: "))
    spec = re.search(r'--task sweep --sweep "([^"]+)"', run).group(1)
    assert spec.startswith("t=gguf,kernels=invariant,d=q4k") and "k=3,sched=dynamic" in spec
    assert "Engines side by side" in summary and "onnxruntime-genai" in summary
    for platform in headings[1:]:
        image = f"![Absolute speed on {platform}](./{platform}/{page.SPEEDS_PNG})"
        if image in text:
            assert (RESULTS / platform / page.SPEEDS_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"./amd-epyc-2c-avx512/{page.SPEEDS_PNG}" in text


def test_each_benchmark_table_names_the_command_that_made_its_rows(pytester):
    """Rows of the benchmark suite are remade by pytest, not the CLI: each table names the pytest
    selection of its case today (one test), or says that no current case measures it."""
    text = page.results_page(RESULTS)
    commands = sorted(
        set(re.findall(r"- command: `(pytest perf/test_benchmark\.py -k \"[^\"]+\"[^`]*)`", text))
    )
    assert len(commands) >= 4, commands
    for command in commands:
        selection = re.search(r'-k "([^"]+)"', command).group(1)
        done = pytest_in_process(pytester, "--collect-only", "-q", "perf/test_benchmark.py", "-k", selection)
        # One case: its three pytest-benchmark entries (the gating ratio and the two arms).
        assert done.returncode == 0 and "3/" in done.stdout and "tests collected" in done.stdout, done.stdout
        ids = sorted(line for line in done.stdout.splitlines() if "::" in line)
        assert [i.rsplit("-", 1)[1] for i in ids] == ["assisted]", "plain]", "ratio]"], ids
        assert len({i.rsplit("-", 1)[0] for i in ids}) == 1, ids
    assert "- command: none today (the benchmark suite measured case " in text


def _assert_each_collects_alone(pytester: pytest.Pytester, tests: list[str]) -> None:
    """pytest collects exactly these node ids: each names one test that exists."""
    done = pytest_in_process(pytester, "--collect-only", "-q", *sorted(set(tests)), cwd=RESULTS.parent)
    collected = sorted(line for line in done.stdout.splitlines() if "::" in line)
    assert done.returncode == 0 and collected == sorted(set(tests)), done.stdout[-2000:]


def test_each_divergence_tier_names_the_one_test_that_wrote_it(pytester):
    text = page.results_page(RESULTS)
    tests = re.findall(r"- command \([^)]+\): `pytest (perf/test_decode\.py::\S+) --real-prompts", text)
    files = list(RESULTS.glob("*/divergence/*.jsonl"))
    assert len(tests) == len(files) >= 8, tests
    _assert_each_collects_alone(pytester, tests)


def test_each_humaneval_run_names_the_one_test_that_writes_it(pytester):
    """Each HumanEval table's command is one test node (collected here), whatever its target or
    engine, so rerunning it remakes those rows and nothing else."""
    text = page.results_page(RESULTS)
    tests = re.findall(r"- command: `pytest (perf/test_humaneval\.py::\S+) --humaneval-limit", text)
    assert len(tests) == len(list(RESULTS.glob("*/humaneval/*.jsonl"))) >= 3, tests
    # And the engines' and ONNX Runtime's, as their tests name their rows.
    engines = ["llama.cpp", "openvino", "onnxruntime-genai-CPUExecutionProvider"]
    stems = [*engines, "onnxruntime-CPUExecutionProvider"]
    tests += [page.humaneval_test(f"qwen2.5-coder-1.5b-{stem}") for stem in stems]
    _assert_each_collects_alone(pytester, tests)
    assert page.humaneval_test("someone-elses-pair-fp32") is None


def test_a_real_case_is_named_by_its_pytest_selection():
    from harness.base import backends
    from harness.experiments import bench
    from harness.pairs import models

    spec, provider = models.get_pair(models.DEFAULT_PAIR), backends.DEFAULT_PROVIDER
    for case, words in (
        (bench.registered_case(spec), "registered"),
        (bench.fp32_case(spec), "fp32"),
        (bench.ort_case(spec, provider), "test_benchmark_real_onnxruntime"),
        (bench.engine_case(spec, "onnxruntime-genai", provider), "real_engine and onnxruntime_genai"),
        (bench.engine_case(spec, "llama.cpp"), "test_benchmark_real_engine and llama_cpp"),
    ):
        command = bench.real_case_command(spec, case.case_id, 5, provider)
        assert command is not None and words in command and "--perf-repetitions 5" in command
    old = bench.case(spec, 128, 32, target_precision="w8af32", draft_precision="w8af32")
    assert bench.real_case_command(spec, old.case_id, 5, provider) is None


def test_each_committed_sweep_page_embeds_its_own_plot():
    sweeps = sorted((ROOT / "results").glob("*/sweep-*.md"))
    assert sweeps
    for sweep_page in sweeps:
        plots = re.findall(r"\]\(\./([^)]+\.png)\)", sweep_page.read_text())
        assert plots == [sweep_page.with_suffix(".png").name], f"{sweep_page} embeds {plots}"
        assert sweep_page.with_suffix(".png").is_file()


def test_the_page_shows_acceptance_per_engine_and_position_with_its_chart(tmp_path):
    """The committed acceptance references (every host is held to them): per engine, acceptance
    length and acceptance by draft position, with the floors, and a chart of them."""
    text = page.results_page(RESULTS)
    section = text.split("## Acceptance, held on every host", 1)[1].split("\n## ", 1)[0]
    assert page.ACCEPTANCE_COMMAND in section
    for engine in ("transformers", "llama.cpp", "onnxruntime-genai", "openvino"):
        line = next((ln for ln in section.splitlines() if f"/ {engine} /" in ln), None)
        assert line is not None, f"no acceptance reference for {engine}"
        rates = line.split("|")[4].strip()
        # K=3 positions at least (proposals from the context may run past K)
        assert rates != "not counted" and len(rates.split(" / ")) >= 3, line
    out = tmp_path / "out"
    page.write_results_page(RESULTS, out=out)
    assert (out / page.ACCEPTANCE_PNG).read_bytes().startswith(b"\x89PNG")


def test_the_page_shows_a_serving_engine_under_concurrent_streams(tmp_path):
    """The committed concurrency rows: per level, plain and speculative tokens/s (all streams and
    each request) and speculation's gain, the command that measures them, and their plot."""
    text = page.results_page(RESULTS)
    out = tmp_path / "out"
    page.write_results_page(RESULTS, out=out)
    urls = "--endpoint http://127.0.0.1:18431 --speculative-endpoint http://127.0.0.1:18432"
    served = f"--engine served {urls} "
    for engine, command in (("llama.cpp", "--engine llama.cpp "), ("served", served)):
        heading = f"#### Concurrent streams: qwen2.5-coder-1.5b on {engine}"
        section = text.split(heading, 1)[1].split("\n#### ", 1)[0].split("\n## ", 1)[0]
        assert command + "--concurrency 1,2,4,8 --compare --limit 16" in section  # the deployment's URLs
        levels = [line for line in section.splitlines() if re.match(r"\| [0-9]+ ", line)]
        assert [line.split("|")[1].strip() for line in levels] == ["1", "2", "4", "8"]
        assert all(line.rstrip(" |").endswith("x") for line in levels)
        png = out / "amd-epyc-2c-avx512" / f"concurrency-qwen2.5-coder-1.5b-{engine}-amd-epyc-2c-avx512.png"
        assert png.read_bytes().startswith(b"\x89PNG")


def test_the_page_shows_speedup_and_acceptance_against_context_length(tmp_path):
    """The committed long-context rows: per context length, each engine's speedup over its own plain
    decoding in decoding and end to end (and its lowest prompt's), tokens per verification, each
    engine's own command, and the plot."""
    text = page.results_page(RESULTS)
    sections = {
        part.split("- rows: `", 1)[1].split("`", 1)[0]: part.split("\n#### ", 1)[0]
        for part in text.split("#### Context length: qwen2.5-coder-1.5b")[1:]
    }
    # Each rows file gets its own section, headed by the machine its rows ran on.
    mine = "results/rows/context/qwen2.5-coder-1.5b-default-amd-epyc-2c.jsonl"
    assert "- machine: `amd-epyc-2c`" in sections[mine]
    section = sections["results/rows/context/qwen2.5-coder-1.5b-amd-epyc-2c-avx512.jsonl"]
    assert "- machine: `amd-epyc-2c-avx512`" in section
    assert "--context-tokens 1024,2048,4096,8000 --compare --limit 3 --max_new_tokens 128" in section
    assert "--engine llama.cpp --context-tokens 1024,4096,8000 --compare --limit 1" in section
    lines = [line for line in section.splitlines() if re.match(r"\|\s+[0-9]+\s+\|", line)]
    assert [line.split("|")[1].strip() for line in lines] == ["1024", "2048", "4096", "8000"]
    header = next(line for line in section.splitlines() if "context tokens |" in line)
    # The registered configuration proposes from the context: its column says so, and its cells the share.
    assert "transformers: context (16) + draft" in header and "llama.cpp" in header
    cell = re.compile(r"[0-9.]+x / [0-9.]+x \(lowest [0-9.]+x\) / [0-9.]+( \([0-9]+% from context\))?")
    assert all(cell.fullmatch(line.split("|")[2].strip()) and "from context" in line for line in lines)
    out = tmp_path / "out"
    page.write_results_page(RESULTS, out=out)
    assert (out / "amd-epyc-2c-avx512" / page.CONTEXT_PNG).read_bytes().startswith(b"\x89PNG")


def test_each_category_table_tells_its_configurations_apart():
    """A sweep of one engine's configurations that differ in a setting alone (the chain's K, with the
    same proposals from the context) heads each category column with its configuration's label, so a
    reader can tell which column is which, in the order of the sweep's own table."""
    text = page.results_page(RESULTS)
    tables = [part.split("\n\n", 2)[1] for part in text.split("Per task category (")[1:]]
    assert tables
    for table in tables:
        header = [c.strip() for c in table.splitlines()[0].split("|")[2:-1]]
        assert len(set(header)) == len(header), header
    depth = next(t for t in tables if "-K1-" in t)
    header = [c.strip() for c in depth.splitlines()[0].split("|")[2:-1]]
    assert [h.split("-K", 1)[1][0] for h in header] == ["1", "2", "3"]
