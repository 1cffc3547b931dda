"""Cached files are checked before they are used: sizes always, content (sha256) whenever a file's
modification time moved since it was recorded or when asked (``--verify``)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from harness.base import files


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"0123456789" * 100)
    (tmp_path / "b.json").write_text('{"x": 1}')
    return tmp_path


def test_an_intact_folder_has_no_problem(folder):
    record = files.record(folder, ["a.bin", "b.json"])
    assert record["a.bin"]["size"] == 1000 and len(record["a.bin"]["sha256"]) == 64
    assert files.problem(folder, record) is None
    assert files.problem(folder, record, verify=True) is None


def _overwrite_same_size(path, keep_mtime: bool) -> None:
    stat = path.stat()
    data = path.read_bytes()
    path.write_bytes(bytes(len(data)))  # zeros, same size
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:10]), "is 10 bytes, recorded 1000"),
        (lambda p: p.unlink(), "is missing"),
        (lambda p: _overwrite_same_size(p, keep_mtime=False), "content changed"),
    ],
    ids=["truncated", "missing", "same-size-overwrite"],
)
def test_each_kind_of_damage_is_named(folder, damage, expected):
    record = files.record(folder, ["a.bin"])
    damage(folder / "a.bin")
    assert expected in files.problem(folder, record)


def test_an_overwrite_that_kept_its_mtime_is_found_when_verifying(folder):
    record = files.record(folder, ["a.bin"])
    _overwrite_same_size(folder / "a.bin", keep_mtime=True)
    assert files.problem(folder, record) is None  # the cheap check cannot see it
    assert "content changed" in files.problem(folder, record, verify=True)


def test_a_record_of_sizes_only_is_still_read(folder):
    assert files.problem(folder, {"a.bin": 1000}) is None
    assert "recorded 999" in files.problem(folder, {"a.bin": 999})


def test_an_onnx_export_whose_file_changed_is_not_used(tmp_path):
    import json

    from harness.weights import onnx_export

    for name in ("model.onnx", "model.onnx.data"):
        (tmp_path / name).write_bytes(name.encode() * 50)
    marker = {"files": files.record(tmp_path, ["model.onnx", "model.onnx.data"])}
    (tmp_path / onnx_export.MARKER).write_text(json.dumps(marker))
    assert onnx_export.is_exported(tmp_path)
    _overwrite_same_size(tmp_path / "model.onnx.data", keep_mtime=True)
    assert onnx_export.is_exported(tmp_path)  # sizes and mtimes unchanged: only --verify can tell
    assert not onnx_export.is_exported(tmp_path, verify=True)
    _overwrite_same_size(tmp_path / "model.onnx.data", keep_mtime=False)
    assert not onnx_export.is_exported(tmp_path)


def test_a_damaged_tiny_model_folder_is_saved_again_not_exported(tmp_path):
    from harness.weights import onnx_export, tiny

    target, tokenizer = tiny.build_target("tiny-llama"), tiny.build_tokenizer()
    folder = tiny.saved_folder("tiny-llama", target, tokenizer, root=str(tmp_path))
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    _overwrite_same_size(weights, keep_mtime=False)
    again = tiny.saved_folder("tiny-llama", target, tokenizer, root=str(tmp_path))
    assert again == folder and weights.read_bytes() == good
    assert folder.name.endswith(onnx_export.source_fingerprint(folder)[:16])


def test_build_once_builds_once_while_others_wait(tmp_path):
    out = tmp_path / "built"
    builds = []

    def build() -> None:
        builds.append(1)
        time.sleep(0.3)  # the other caller arrives while this one holds the lock
        out.write_text("done")

    callers = [
        threading.Thread(target=files.build_once, args=(tmp_path / ".lock", out.exists, build))
        for _ in range(3)
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert builds == [1] and out.read_text() == "done"
    files.build_once(tmp_path / ".lock", out.exists, build)  # already done: not built again
    assert builds == [1]


def test_a_failed_build_releases_the_lock_for_the_next_caller(tmp_path):
    def fail() -> None:
        raise RuntimeError("compiler missing")

    with pytest.raises(RuntimeError):
        files.build_once(tmp_path / "sub" / ".lock", lambda: False, fail)
    built = []
    files.build_once(tmp_path / "sub" / ".lock", lambda: bool(built), lambda: built.append(1))
    assert built == [1]
