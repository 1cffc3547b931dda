"""A new run setting is one field and one ``setup.FIELDS`` entry: with no other change it has a CLI
flag, a row column, a place in the resume key, the baseline key and the reproduce command.

The setting is added in a fresh interpreter before the rest of the suite is imported, as a change to
``harness/settings/setup.py`` would add it, and the real command line then decodes with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ADD_A_SETTING = textwrap.dedent(
    """
    import dataclasses, json, sys
    from harness.settings import setup

    @dataclasses.dataclass(frozen=True)
    class Settings(setup.GenerationSettings):
        probe_width: int = 7

    setup.GenerationSettings = Settings
    setup.FIELDS = (
        *setup.FIELDS,
        setup.Field("probe_width", "--probe_width", "sampling", lambda s: s.decoding.probe_width, 7),
    )

    from harness.settings import baselines, results
    from harness.experiments import bench
    from harness import cli
    from harness.pairs import models

    rows_path = sys.argv[1]
    argv = ["--model_name", "tiny-llama", "--limit", "1", "--max_new_tokens", "4", "--no-progress",
            "--json", rows_path, "--probe_width", "3"]
    assert cli.main(argv) == 0
    first = results.read_rows(rows_path)
    assert cli.main(argv) == 0  # the same command again resumes its row
    again = results.read_rows(rows_path)
    other = bench.case("tiny-llama", 16, 8, sampling={"probe_width": 3})
    json.dump(
        {
            "flag": "--probe_width" in cli.build_parser().format_help(),
            "column": [r.probe_width for r in first],
            "resumed": len(again),
            "key_has_it": dataclasses.replace(first[0], probe_width=4).key() != first[0].key(),
            "reproduce": cli.reproduce(
                cli.build_parser().parse_args(argv), first[0], setup.defaults(models.get_pair("tiny-llama"))
            ),
            "default": setup.defaults(models.get_pair("tiny-llama")).get("probe_width"),
            "case_id": other.case_id,
            "default_case_id": bench.case("tiny-llama", 16, 8).case_id,
        },
        sys.stdout,
    )
    """
)


def test_a_new_setting_reaches_flag_row_keys_and_command(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", ADD_A_SETTING, str(rows)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["flag"]
    assert seen["column"] == [3]
    assert seen["resumed"] == 1
    assert seen["key_has_it"]
    assert "--probe_width 3" in seen["reproduce"]
    assert seen["default"] == 7  # what a command without the flag runs, so the command may leave it out
    assert seen["case_id"].endswith("-probe-width_3"), seen
    assert "probe_width" not in seen["default_case_id"]  # the default leaves every case id as it was
    assert json.loads(rows.read_text().splitlines()[0])["probe_width"] == 3
