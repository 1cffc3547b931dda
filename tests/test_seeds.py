import json
import math
import re
from pathlib import Path

import pytest

from harness.base.errors import HarnessError
from harness.settings.baselines import list_baselines, platform_records, read_storage
from harness.settings.seeds import (
    REPO_ROOT,
    import_seed_baselines,
    parse_command,
    parse_seed_file,
    parse_seeds,
)

# The seed documents the project parses, kept with the tests so every clone runs every test.
SEEDS_DIR = Path(__file__).resolve().parent / "fixtures" / "seeds"

LLAMA = "000_c2f0946e9de8063c.txt"
CODELLAMA = "001_3a949b52e976c26e.txt"
OPT = "002_a971465576dd9641.txt"
QWEN = "003_9e509dae3e5f0137.txt"
README = "004_357238f2d7bac6bc.txt"

# Rows per table, in file order, counted by hand from the seed files. None marks a table that is not one of
# the seven-column result tables (the CodeLlama speed-up summary, the README's model list).
EXPECTED_ROWS = {
    LLAMA: [10, 10, 4, 10],
    CODELLAMA: [13] * 9 + [None, 6, 6],
    OPT: [10] * 5,
    QWEN: [10] * 4,
    README: [None],
}
EXPECTED_PLATFORMS = {LLAMA: {"stx"}, CODELLAMA: {"hpt", "phx", "stx"}, OPT: {"phx"}, QWEN: {"phx"}}


def tables_of(name):
    return parse_seed_file(SEEDS_DIR / name)


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_every_table_found_with_its_rows(name):
    tables = tables_of(name)
    got = [len(t.rows) if t.is_result else None for t in tables]
    assert got == EXPECTED_ROWS[name]
    if name in EXPECTED_PLATFORMS:
        assert {t.platform for t in tables if t.is_result} == EXPECTED_PLATFORMS[name]


def test_codellama_hpt_plain_decode():
    hpt = [t for t in tables_of(CODELLAMA) if t.platform == "hpt"]
    plain = hpt[0]
    assert plain.command.strip() == "assisted_generation.py --model_name CodeLlama-7b-hf --task decode"
    assert plain.flags["task"] == "decode" and plain.flags["assisted_generation"] is False
    assert plain.model == "CodeLlama-7b-hf" and not plain.assisted
    assert len(plain.rows) == 13
    assert plain.rows[7] == {
        "example": 8,
        "prompt_tokens": 160,
        "new_tokens": 200,
        "total_s": 41.9705,
        "prefill_ms": 4143.18,
        "time_per_token_ms": 187.89,
        "tokens_per_s": 5.32228,
    }
    assert plain.context["target_device"] == "AIE" and plain.context["target_precision"] == "w6a16"
    assert [t.flags["draft_precision"] for t in hpt[1:]] == [None, "w8af32"]


def test_bold_is_stripped():
    assisted = [t for t in tables_of(CODELLAMA) if t.platform == "hpt"][1]
    assert assisted.rows[0]["tokens_per_s"] == 15.2286  # published as **15.2286**
    raw = (SEEDS_DIR / CODELLAMA).read_text()
    assert "**15.2286**" in raw


def test_na_cells_become_none_and_reference_tables_are_phx():
    cpu = [t for t in tables_of(CODELLAMA) if t.is_result and t.context.get("target_device") == "CPU"]
    assert len(cpu) == 2 and {t.platform for t in cpu} == {"phx"}  # "## PHX - Just for reference" in STX
    first = cpu[0].rows[0]
    assert first["tokens_per_s"] is None and first["prefill_ms"] is None and first["total_s"] == 76.5971


def test_llama_settings_come_from_bullets_and_headings():
    tables = tables_of(LLAMA)
    assert all(t.platform_heading == "STX B0 with MCDM - 7/13/2024" for t in tables)
    settings = tables[0].context["settings"]
    assert settings == {
        "top_p": 0.95,
        "temperature": 0.1,
        "do_sample": True,
        "num_assistant_tokens": 6,
        "schedule": "constant",
    }
    assert tables[1].context["draft_model"] == "JackFram/llama-160m"
    last = tables[3]  # published without a command line of its own
    assert last.command is None and last.assisted
    assert last.context["draft_model"] == "amd-pretrained-135m-2k-no-book3"


def test_parse_command_flags():
    flags = parse_command(
        "assisted_generation.py --model_name opt-6.7b --task benchmark --do_sample --temperature 1.0 "
        "--assisted_generation --draft_precision w8af32 --new_flag 3"
    )
    assert flags["model_name"] == "opt-6.7b" and flags["task"] == "benchmark"
    assert flags["do_sample"] is True and flags["temperature"] == 1.0
    assert flags["assisted_generation"] is True and flags["draft_precision"] == "w8af32"
    assert flags["unknown"] == ["--new_flag", "3"]


def test_parser_on_a_small_synthetic_seed(tmp_path):
    seed = tmp_path / "s.txt"
    seed.write_text(
        "# Title\n\n# HPT\n\n## Target: AIE/w4abf16 Assistant: CPU/bf16\n\n"
        "```python assisted_generation.py --model_name m --task decode```\n\n"
        "| Example# | Prompt Length (tokens) | New Tokens Generated | Total Time (s) | Prefill Phase (ms) "
        "| Time/Token (ms) | Tokens/Sec |\n|---|---|---|---|---|---|---|\n"
        "| 1 | 8 | 30 | 4.0 | na | 100.0 | **10.0** |\n"
    )
    (table,) = parse_seed_file(seed)
    assert table.platform == "hpt" and table.model == "m" and table.is_result
    assert table.rows == [
        {
            "example": 1,
            "prompt_tokens": 8,
            "new_tokens": 30,
            "total_s": 4.0,
            "prefill_ms": None,
            "time_per_token_ms": 100.0,
            "tokens_per_s": 10.0,
        }
    ]
    assert table.context["assistant_precision"] == "bf16"


def test_bad_cell_names_the_line(tmp_path):
    seed = tmp_path / "s.txt"
    seed.write_text(
        "# PHX\n| Example# | Prompt Length (tokens) | New Tokens Generated | Total Time (s) "
        "| Prefill Phase (ms) | Time/Token (ms) | Tokens/Sec |\n|---|---|---|---|---|---|---|\n"
        "| 1 | 8 | 30 | oops | 1 | 1 | 1 |\n"
    )
    with pytest.raises(HarnessError, match=r"s\.txt:2"):
        parse_seed_file(seed)


def test_missing_seeds_folder(tmp_path):
    with pytest.raises(HarnessError, match="not found"):
        parse_seeds(tmp_path / "nope")


def test_import_writes_one_baseline_per_assisted_table(tmp_path):
    paths = import_seed_baselines(SEEDS_DIR, tmp_path)
    assisted_tables = [t for t in parse_seeds(SEEDS_DIR) if t.is_result and t.assisted]
    records = [r for p in paths for r in read_storage(p)]
    assert len(records) == len(assisted_tables) == 15  # llama 3, CodeLlama 7, OPT 3, Qwen 2
    assert paths == list_baselines(tmp_path)  # one pytest-benchmark storage per platform
    assert [p.relative_to(tmp_path).parts for p in paths] == [
        (name, "0001_baseline.json") for name in ("hpt", "phx", "stx")
    ]
    assert not list(tmp_path.rglob("*.txt"))  # seeds are read, never copied
    assert all(r.source.startswith("seed:") for r in records)
    # Marked as imported in pytest-benchmark's terms too: each entry says so, and the machine.
    for path in paths:
        doc = json.loads(path.read_text())
        assert doc["machine_info"]["source"].startswith("seed:")
        assert all("published table" in e["extra_info"]["imported"] for e in doc["benchmarks"])
    no_plain = [r for r in records if r.speedup is None]
    assert [r.case.task for r in no_plain] == ["benchmark"]  # llama benchmark has no plain table
    # Deterministic: a second import rewrites byte-identical files.
    before = {p: p.read_bytes() for p in paths}
    import_seed_baselines(SEEDS_DIR, tmp_path)
    assert {p: p.read_bytes() for p in paths} == before


def test_imported_speedups_match_the_seed_summary(tmp_path):
    import_seed_baselines(SEEDS_DIR, tmp_path)
    rec = next(
        r
        for r in platform_records(tmp_path, "phx")
        if r.case.case_id == "decode-t_bf16-d_bf16-kdefault-greedy"
    )
    by_example = {p["example"]: p["speedup"] for p in rec.speedup["per_prompt"]}
    summary = next(t for t in tables_of(CODELLAMA) if not t.is_result)
    for row in summary.rows:  # e.g. "(127.24/200) / (19.17/200) = 6.64x"
        published = float(re.search(r"=\s*([0-9.]+)x", row["Speed-up with avg token-time"]).group(1))
        assert by_example[int(row["Example #"])] == pytest.approx(published, abs=0.01)
    hpt = next(
        r
        for r in platform_records(tmp_path, "hpt")
        if r.case.case_id == "decode-t_w6a16-d_default-kdefault-greedy"
    )
    assert hpt.speedup["per_prompt"][0]["speedup"] == pytest.approx(15.2286 / 5.48159, rel=1e-5)
    assert hpt.speedup["low"] < hpt.speedup["value"] < hpt.speedup["high"]
    assert "Target: AIE/w6a16" in hpt.extra["notes"]


def _owned(doc: dict) -> dict:
    """What an import stores of its own in a pytest-benchmark saved run: every field but the
    statistics pytest-benchmark derives from the rounds and its version string (both move with its
    releases: 5.3 computes ``hd15iqr`` otherwise than 5.2). The rounds themselves, ``stats.data``,
    are the seed table's rows in the unit ``extra_info`` names, and stay."""
    benchmarks = [{**b, "stats": {"data": b["stats"]["data"]}} for b in doc["benchmarks"]]
    return {**{k: v for k, v in doc.items() if k != "version"}, "benchmarks": benchmarks}


def _differences(committed, fresh, where: str = "") -> list[str]:
    """Where two stored runs differ, floats compared to within the last bits Python versions change."""
    if isinstance(committed, float) and isinstance(fresh, float):
        return [] if math.isclose(committed, fresh, rel_tol=1e-9, abs_tol=1.01e-5) else [where]
    if isinstance(committed, dict) and isinstance(fresh, dict):
        if committed.keys() != fresh.keys():
            return [f"{where} keys"]
        return [d for k in committed for d in _differences(committed[k], fresh[k], f"{where}.{k}")]
    if isinstance(committed, list) and isinstance(fresh, list) and len(committed) == len(fresh):
        pairs = enumerate(zip(committed, fresh, strict=True))
        return [d for i, (a, b) in pairs for d in _differences(a, b, f"{where}[{i}]")]
    return [] if committed == fresh else [where]


def test_owned_fields_hold_the_seed_rows_not_the_library_statistics():
    doc = json.loads((REPO_ROOT / "baselines" / "hpt" / "0001_baseline.json").read_text())
    owned = _owned(doc)
    assert "version" not in owned and set(owned["benchmarks"][0]["stats"]) == {"data"}
    # The published CodeLlama hpt plain table's examples: seconds per token, from its Tokens/Sec.
    plain = next(b for b in owned["benchmarks"] if b["params"] == {"arm": "plain"})
    assert plain["extra_info"]["unit"] == "seconds per token"
    assert plain["stats"]["data"][7] == pytest.approx(1 / 5.32228)
    moved = json.loads(json.dumps(doc))
    moved["version"], moved["benchmarks"][0]["stats"]["hd15iqr"] = "9.9.9", -1.0
    assert not _differences(_owned(doc), _owned(moved))
    moved["benchmarks"][0]["stats"]["data"][0] *= 1.01
    assert _differences(_owned(doc), _owned(moved)) == [".benchmarks[0].stats.data[0]"]


def test_committed_baselines_match_the_seeds(tmp_path):
    committed_root = REPO_ROOT / "baselines"
    fresh = import_seed_baselines(SEEDS_DIR, tmp_path)
    for path in fresh:
        committed = committed_root / path.relative_to(tmp_path)
        assert committed.is_file(), (
            f"{committed} missing: run `python -m harness.seeds` and commit baselines/"
        )
        differ = _differences(_owned(json.loads(committed.read_text())), _owned(json.loads(path.read_text())))
        assert not differ, f"{committed} is stale at {differ[:5]}: rerun `python -m harness.seeds`"
    from_seeds = {
        p.relative_to(committed_root)
        for p in list_baselines(committed_root)
        if any(r.source.startswith("seed:") for r in read_storage(p))
    }
    assert from_seeds == {p.relative_to(tmp_path) for p in fresh}, "committed seed baselines no seed produces"
