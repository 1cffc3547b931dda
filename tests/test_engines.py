"""Loading a pair through its engine: one entry for the CLI, the sweep and the pytest plugin."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import installed_engine, pytest_in_process

from harness import cli
from harness.base.errors import HarnessError
from harness.decoding import engines
from harness.pairs import models
from harness.settings import setup
from harness.suite import PairCache


def test_an_unknown_engine_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "load_pair", lambda *a, **k: pytest.fail("loaded"))
    spec = models.get_pair("tiny-llama")
    run = setup.resolve(spec)
    with pytest.raises(HarnessError, match="unknown engine 'vllm': choose one of transformers, llama.cpp"):
        engines.load(spec, dataclasses.replace(run, target=dataclasses.replace(run.target, engine="vllm")))
    with pytest.raises(HarnessError, match="choose one of"):
        engines.check(spec, dataclasses.replace(run, target=dataclasses.replace(run.target, engine="vllm")))


BUILT_IN = {"transformers", "onnxruntime-genai", "llama.cpp", "openvino", "served"}


def test_the_entry_point_group_registers_every_built_in_engine_and_the_cli_offers_each() -> None:
    from importlib import metadata

    listed = {p.name: p.value for p in metadata.entry_points(group=engines.GROUP)}
    assert BUILT_IN <= set(listed)
    assert all(listed[name].startswith("harness.decoding.") for name in BUILT_IN)
    for name in engines.names():
        cls = engines.engine_class(name)
        assert issubclass(cls, engines.Engine) and cls.name == name
    parser = cli.build_parser()
    assert {parser.parse_args(["--engine", name]).engine for name in engines.names()} == set(engines.names())


@pytest.fixture
def fresh_registry():
    engines._registered.cache_clear()
    engines.engine_class.cache_clear()
    yield
    engines._registered.cache_clear()
    engines.engine_class.cache_clear()


def test_a_plugin_engine_that_fails_to_import_is_one_line_naming_its_package(
    tmp_path, monkeypatch: pytest.MonkeyPatch, fresh_registry
) -> None:
    (tmp_path / "broken_engine.py").write_text("import a_runtime_that_is_not_installed\n")
    installed_engine(tmp_path, "broken", "broken_engine:Engine")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "broken" in engines.names()
    with pytest.raises(HarnessError) as err:
        engines.engine_class("broken")
    message = str(err.value)
    assert "broken-engine" in message and "ModuleNotFoundError" in message and "\n" not in message
    assert engines.engine_class("transformers").name == "transformers"  # the others still load


def test_a_plugin_entry_that_is_not_an_engine_class_is_refused(
    tmp_path, monkeypatch: pytest.MonkeyPatch, fresh_registry
) -> None:
    (tmp_path / "not_engine.py").write_text("class Thing:\n    name = 'thing'\n")
    installed_engine(tmp_path, "thing", "not_engine:Thing")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HarnessError, match="not a harness.decoding.base.Engine subclass"):
        engines.engine_class("thing")


@pytest.mark.parametrize("setting", ["draft_precision", "draft_vocab", "draft_kernels", "target_kernels"])
def test_the_engine_refuses_settings_of_transformers_loop(setting: str) -> None:
    value = 64 if setting == "draft_vocab" else "fp32"
    spec = models.get_pair("tiny-qwen2")
    with pytest.raises(HarnessError, match=f"--{setting} applies to --engine transformers"):
        engines.resolve(spec, engine="onnxruntime-genai", **{setting: value})


def test_a_run_of_one_pair_does_not_load_another() -> None:
    run = setup.resolve(models.get_pair("tiny-llama"))
    with pytest.raises(HarnessError, match="cannot load pair tiny-qwen2"):
        engines.load("tiny-qwen2", run)


def test_two_spellings_of_one_configuration_share_one_load() -> None:
    cache = PairCache(None)
    registered = cache.get("tiny-llama")
    assert cache.get("tiny-llama", target_precision="fp32", draft_kernels="stock") is registered
    assert cache.get("tiny-llama", with_draft=False) is not registered
    assert cache.get("tiny-llama", with_draft=False).draft is None


def test_an_option_only_one_engine_reads_is_refused_with_another(capsys: pytest.CaptureFixture) -> None:
    code = cli.main(["--model_name", "tiny-llama", "--llama-server", "/bin/true", "--limit", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--llama-server is read by --engine llama.cpp only" in err
    assert "Traceback" not in err


def test_the_core_suite_and_transformers_run_without_the_engines_runtimes(tmp_path) -> None:
    """Each engine's runtime is an optional extra: with ONNX Runtime, onnxruntime-genai and OpenVINO
    not importable, the CLI decodes on transformers and the suites collect, saying once what they
    leave out and which extra installs it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('onnxruntime', 'onnxruntime_genai', 'openvino', 'openvino_genai', 'onnx_ir'):\n"
        "    sys.modules[name] = None  # as if not installed\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(tmp_path)
    cli_run = subprocess.run(
        [sys.executable, "assisted_generation.py", "--model_name", "tiny-llama", "--compare", "--limit", "1",
         "--max_new_tokens", "8", "--no_progress"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli_run.returncode == 0, cli_run.stderr[-2000:]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "perf"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    out = collected.stdout
    assert "engine openvino not run here: its runtime (openvino_genai) is not installed: pip install " in out
    assert (
        '"assisted-generation-harness[onnxruntime]"' in out
        and "target backend onnxruntime not run here" in out
    )
    assert "openvino]" not in out.split("engines left out")[0]  # no OpenVINO case collected
    assert "test_engine_tier[qwen2.5-coder-1.5b-llama_cpp]" in out


def test_each_perf_suite_collects_every_engines_cases(pytester) -> None:
    """The three perf files cross their tiers with the engine axis: llama.cpp's, OpenVINO's and
    onnxruntime-genai's cases beside transformers' (its own tiers over precisions and backends)."""
    done = pytest_in_process(pytester, "--co", "-q", "perf")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    for suite in ("perf/test_decode.py", "perf/test_benchmark.py", "perf/test_humaneval.py"):
        mine = [i for i in ids if i.startswith(suite)]
        for engine in ("-llama_cpp", "-openvino", "-onnxruntime_genai"):
            assert any(f"{engine}]" in i or f"{engine}-" in i for i in mine), (suite, engine)
        assert any("_engine" not in i.split("[")[0] and "real" in i for i in mine), suite  # transformers'
