"""The target-backend seam: names, providers and export settings are checked before anything loads,
and every error says what is available instead."""

from __future__ import annotations

import pytest
from helpers import load_pair
from hypothesis import given
from hypothesis import strategies as st

from harness import cli
from harness.base import backends
from harness.base.backends import ACCURACY_LEVELS, OrtSettings
from harness.base.errors import HarnessError, UnsupportedError
from harness.settings.results import read_rows


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(HarnessError, match="torch, onnxruntime"):
        backends.check_backend("tensorrt")


def test_missing_provider_lists_the_available_ones():
    with pytest.raises(UnsupportedError) as err:
        backends.check_provider("VitisAIExecutionProvider")
    message = str(err.value)
    assert "'VitisAIExecutionProvider' is not available" in message
    assert "CPUExecutionProvider" in message and "onnxruntime-vitisai" in message


def test_cpu_provider_is_available():
    assert backends.check_provider(backends.DEFAULT_PROVIDER) == "CPUExecutionProvider"
    assert backends.DEFAULT_PROVIDER in backends.available_providers()


@given(
    block=st.sampled_from([16, 32, 64, 128, 256]),
    level=st.sampled_from(sorted(ACCURACY_LEVELS)),
    provider=st.sampled_from(["CPUExecutionProvider", "CUDAExecutionProvider"]),
)
def test_label_round_trips(block, level, provider):
    s = OrtSettings("int4", block, level, provider)
    assert OrtSettings.from_label(s.label, provider) == s
    assert OrtSettings.from_label("ort-fp32", provider) == OrtSettings("fp32", provider=provider)


def test_labels_name_every_export_setting():
    assert OrtSettings().label == "ort-int4-b32-aint8"
    assert OrtSettings("int4", 128, 1).label == "ort-int4-b128-afp32"
    assert len({OrtSettings("int4", b, a).label for b in (32, 64) for a in (1, 4)}) == 4


@pytest.mark.parametrize(
    "settings,match",
    [
        (OrtSettings("w4abf16"), "not offered with --target_backend onnxruntime"),
        (OrtSettings(block_size=48), "--ort_block_size 48"),
        (OrtSettings(accuracy_level=7), "--ort_accuracy_level 7"),
        (OrtSettings(provider="NoSuchExecutionProvider"), "available here: .*CPUExecutionProvider"),
    ],
)
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(HarnessError, match=match):
        settings.validate()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(name="tiny-opt", target_backend="onnxruntime"), "does not write the 'opt' architecture"),
        (
            dict(name="tiny-qwen2", target_backend="onnxruntime", target_kernels="invariant"),
            "--target_kernels applies to the torch target only",
        ),
        (dict(name="tiny-qwen2", target_precision="int4"), "add --target_backend onnxruntime"),
        (
            dict(name="tiny-qwen2", target_backend="onnxruntime", provider="DmlExecutionProvider"),
            "'DmlExecutionProvider' is not available",
        ),
        (
            dict(name="tiny-qwen2", target_backend="onnxruntime", target_device="cuda"),
            "--target_device|not available",
        ),
    ],
)
def test_load_pair_refuses_before_loading(kwargs, match, monkeypatch):
    # Nothing may be built or exported before the error: make any export fail loudly.
    from harness.weights import onnx_export

    monkeypatch.setattr(onnx_export, "export", lambda *a, **k: pytest.fail("exported before refusing"))
    name = kwargs.pop("name")
    with pytest.raises(HarnessError, match=match):
        load_pair(name, **kwargs)


def test_cli_names_available_providers(capsys):
    code = cli.main(
        ["--model_name", "tiny-qwen2", "--target_backend", "onnxruntime", "--execution_provider", "Foo"]
    )
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert "'Foo' is not available" in err and "CPUExecutionProvider" in err
    assert "Traceback" not in err


def test_cli_runs_an_onnxruntime_target_and_records_it(tmp_path, capsys):
    rows_path = tmp_path / "rows.jsonl"
    argv = ["--model_name", "tiny-qwen2", "--task", "decode", "--compare", "--limit", "1"]
    argv += [
        "--target_backend",
        "onnxruntime",
        "--max_new_tokens",
        "8",
        "--no_progress",
        "--json",
        str(rows_path),
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "on onnxruntime CPUExecutionProvider" in out and "--target_backend onnxruntime" in out
    rows = read_rows(rows_path)
    assert {r.mode for r in rows} == {"plain", "assisted"}
    assert {(r.target_backend, r.execution_provider, r.target_precision) for r in rows} == {
        ("onnxruntime", "CPUExecutionProvider", "ort-int4-b32-aint8")
    }
