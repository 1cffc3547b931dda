"""A user's own pair of local Hugging Face folders runs without touching the registry: through the
CLI (``--model_name_or_path``/``--assistant_model``), the pytest plugin (``--local-pair``) and the
loader; a folder found for a registered name must be that model."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_pair, pytest_in_process

from harness import cli
from harness.base.errors import HarnessError
from harness.pairs import models
from harness.settings import setup
from harness.weights import packaged, tiny

# A test of a user's own repository, using the plugin's fixtures (WHICH: the pairs it runs on).
USER_TEST = Path(__file__).parent / "fixtures" / "user_test.py.txt"
# The cache as the user's runs find it, read before any test moves HOME.
USER_CACHE = packaged.cache_root()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """tiny-llama's target and draft saved as ordinary Hugging Face folders."""
    root = tmp_path_factory.mktemp("models")
    target = tiny.build_target("tiny-llama")
    tokenizer = tiny.build_tokenizer()
    draft = tiny.build_draft("tiny-llama", target)
    return (
        tiny.saved_folder("my-target", target, tokenizer, root=str(root)),
        tiny.saved_folder("my-draft", draft, tokenizer, root=str(root)),
    )


def test_a_local_pair_is_described_from_its_configs(folders):
    target, draft = folders
    spec = models.local_pair(target, draft)
    assert spec.target.path == str(target) and spec.draft.path == str(draft)
    assert spec.target.family == "llama"
    assert spec.target.vocab_size == json.loads((target / "config.json").read_text())["vocab_size"]
    pair = load_pair(spec)
    assert pair.spec is spec and pair.origins == {"target": str(target), "draft": str(draft)}


def _in_a_file_mapping(address: int) -> bool:
    """Whether ``address`` lies in a mapping of a file (Linux's /proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return len(fields) >= 6 and fields[4] != "0" and fields[5].startswith("/")
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_loaded_models_embedding_rows_are_its_own_memory_not_the_files(folders):
    # A decoding step reads one embedding row a token: read from the weights file's mapping, a token
    # met for the first time faulted its page in from disk inside the timed step.
    from safetensors.torch import load_file

    pair = load_pair(models.local_pair(*folders))
    for model, folder in ((pair.target, folders[0]), (pair.draft, folders[1])):
        weight = model.get_input_embeddings().weight
        assert not _in_a_file_mapping(weight.data_ptr())
        stored = load_file(folder / "model.safetensors")
        assert torch.equal(weight, next(t for name, t in stored.items() if "embed_tokens" in name))
    # A layer of the safetensors file that every forward reads whole is left where it is.
    layer = next(p for n, p in pair.target.named_parameters() if "layers.0" in n and p.dim() == 2)
    assert _in_a_file_mapping(layer.data_ptr())


def test_an_embedding_an_output_layer_reads_whole_every_forward_stays_where_it_is():
    model = tiny.build_target("tiny-llama")
    model.lm_head.weight = model.get_input_embeddings().weight  # tied
    where = model.lm_head.weight.data_ptr()
    models.resident_input_embeddings(model)
    assert model.get_input_embeddings().weight.data_ptr() == where == model.lm_head.weight.data_ptr()


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "no config.json"), ("", "not a usable model config"), ('{"model_type": "llama"}', "vocab_size")],
)
def test_a_folder_that_is_not_a_model_is_refused_before_loading(tmp_path, content, expected):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(HarnessError, match=expected):
        models.local_pair(tmp_path)


def test_the_cli_runs_local_folders_and_names_them_in_the_reproduce_command(folders, tmp_path, capsys):
    target, draft = folders
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--model-name-or-path", str(target), "--assistant-model", str(draft), "--compare", "--limit", "1",
            "--max-new-tokens", "6", "--no-progress", "--threads", "1", "--json", str(rows_path)]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert {r["mode"] for r in rows} == {"plain", "assisted"}
    assert all(r["model"] == f"{target.name}+{draft.name}" and r["extra"]["threads"] == 1 for r in rows)
    assisted = next(r for r in rows if r["mode"] == "assisted")
    command = setup.command(assisted, setup.defaults(models.local_pair(target, draft)))
    assert f"--model_name_or_path {target} --assistant_model {draft}" in command
    # Printed as the invocation that made the rows: the row's settings, then the run's own flags.
    printed = command.replace(" --assisted_generation", "") + " --compare --limit 1 --max_new_tokens 6"
    assert printed in out, out
    # the printed command parses back to the same folders
    args = cli.build_parser().parse_args(shlex.split(command)[2:])
    assert (args.model_name_or_path, args.assistant_model) == (str(target), str(draft))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--assistant_model", "/x"], "--assistant_model goes with --model_name_or_path"),
        (["--model_name", "tiny-llama", "--model_name_or_path", "/x"], "are alternatives"),
        (["--model_name_or_path", "/nonexistent/folder"], "no config.json"),
        (["--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_bad_local_pair_flags_are_usage_errors(capsys, argv, expected):
    assert cli.main([*argv, "--limit", "1", "--no_progress"]) == cli.EXIT_USAGE
    assert expected in capsys.readouterr().err


def test_a_folder_found_for_a_registered_name_must_be_that_model(folders, tmp_path):
    """A folder under --weights_dir named like a registered model, holding another model: refused
    before its weights load, instead of running under the registry's label."""
    target, draft = folders
    spec = models.get_pair("opt-6.7b")
    for role in (spec.target, spec.draft):
        (tmp_path / role.name).symlink_to(target)
    with pytest.raises(HarnessError, match="registered with 50272"):
        load_pair("opt-6.7b", weights_dir=str(tmp_path))


def test_help_shows_defaults_and_both_spellings(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # help wraps lines anywhere
    assert "--model_name MODEL_NAME, --model-name MODEL_NAME" in out
    assert "(default: qwen2.5-coder-1.5b)" in out and "(default: 0)" in out


def test_the_plugin_runs_a_users_tests_on_their_local_pair(pytester, folders, tmp_path):
    target, draft = folders
    (tmp_path / "test_mine.py").write_text(USER_TEST.read_text().replace("WHICH", "tiny=False"))
    # pytester points HOME at a temporary folder: the user's own cache is named, or the run would
    # convert the offline pair's weights into an empty one first (about 4 of its 5 minutes).
    env = {**os.environ, packaged.CACHE_ENV: str(USER_CACHE)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--real-pairs", "all",
         "--local-pair", f"mine={target},{draft}", "-k", "mine"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_assisted_equals_plain[mine] PASSED" in done.stdout
    # Said before the run: the local pair's ONNX Runtime cases export its target (16 GB resident for a 1.5B).
    assert "mine: their ONNX Runtime cases export each target once" in done.stdout
    bad = pytest_in_process(pytester, "--local-pair", "mine", "--collect-only", cwd=tmp_path)
    assert bad.returncode == pytest.ExitCode.USAGE_ERROR and "NAME=TARGET[,DRAFT]" in bad.stdout + bad.stderr


def test_folders_with_generic_names_are_named_by_their_parents(tmp_path):
    """This cache's converted folders are all called "hf": a pair of them is named by the models."""
    from harness.weights import tiny

    for name in ("big-coder", "small-coder"):
        tiny.build_target("tiny-llama").save_pretrained(tmp_path / name / "hf")
    spec = models.local_pair(tmp_path / "big-coder" / "hf", tmp_path / "small-coder" / "hf")
    assert spec.name == "big-coder+small-coder" and spec.kind == "code"


def test_a_pair_of_your_own_files_decodes_both_prompt_kinds_unless_told(tmp_path, capsys):
    """No prompt set is guessed from a folder's name: your own pair decodes the mixed set, and
    ``--prompts SET[,SET]|FILE`` chooses."""
    from harness import cli
    from harness.weights import tiny

    target = tiny.build_target("tiny-qwen2")
    tokenizer = tiny.build_tokenizer()
    folder = tiny.saved_folder("my-model", target, tokenizer, str(tmp_path))
    argv = ["--model_name_or_path", str(folder), "--assisted_generation", "--limit", "2",
            "--max_new_tokens", "4", "--no_progress"]  # fmt: skip
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "the mixed prompt set" in err and "--prompts SET[,SET]|FILE chooses (--list-prompts" in err
    assert cli.main([*argv, "--prompts", "code"]) == 0
    assert "prompt set" not in capsys.readouterr().err  # chosen: nothing to say


def test_a_pair_of_your_own_files_runs_at_the_precisions_you_give(pytester, tmp_path):
    """``--local-pair NAME=T,D@q4k,q4k``: the pair's registered configuration is those precisions on
    the batch-invariant kernels they need, which every pair test then runs; a bad one is one line."""
    from harness.weights import tiny

    target = tiny.build_target("tiny-qwen2")
    draft = tiny.build_draft("tiny-qwen2", target)
    tokenizer = tiny.build_tokenizer()
    t = tiny.saved_folder("t", target, tokenizer, str(tmp_path))
    d = tiny.saved_folder("d", draft, tokenizer, str(tmp_path))
    spec = models.local_pair(t, d, ("q4k", "q4k"))
    assert (spec.target_setup.precision, spec.target_setup.kernels) == ("q4k", "invariant")
    assert (spec.draft_setup.precision, spec.draft_setup.kernels) == ("q4k", "invariant")
    assert models.local_pair(t, d).target_setup.precision == "fp32"  # the default: as the files are
    bad = pytest_in_process(
        pytester, "--co", "-q", "perf/test_benchmark.py", "--local-pair", f"mine={t},{d}@q5"
    )
    assert bad.returncode == 4 and "Unknown precision 'q5'" in bad.stderr and "Traceback" not in bad.stderr


def test_your_own_pair_is_told_the_flags_of_its_fastest_exact_configuration(tmp_path, capsys):
    from harness import cli
    from harness.weights import tiny

    target = tiny.build_target("tiny-qwen2")
    folder = tiny.saved_folder("mine", target, tiny.build_tokenizer(), str(tmp_path))
    argv = ["--model_name_or_path", str(folder), "--limit", "1", "--max_new_tokens", "4", "--no_progress"]
    assert cli.main(argv) == 0
    flags = (
        "--target_precision q4k --draft_precision q4k --target_kernels invariant --draft_kernels invariant"
    )
    assert flags in capsys.readouterr().err
    assert cli.main([*argv, "--target_precision", "q4k", "--target_kernels", "invariant"]) == 0
    assert "fastest exact configuration" not in capsys.readouterr().err  # chosen: nothing to say
