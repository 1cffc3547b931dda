"""Hostile programs must be contained, and the sandbox must carry on and score the next program.

Every hostile case is followed by a correct program that must still pass. Cases that exercise the
kernel layers with the Python guard switched off run only where "namespaces" isolation works (root
with util-linux); the guarded variants run under every isolation level this machine offers.
Network tests only ever touch loopback addresses.
"""

from __future__ import annotations

import os
import select
import socket
import time
from pathlib import Path

import pytest

from harness.base.errors import HarnessError, UnsupportedError
from harness.experiments.humaneval import load_problems, program_for
from harness.sandbox.sandbox import (
    ISOLATIONS,
    SandboxResult,
    cgroup_available,
    isolation_works,
    protections,
    run_untrusted,
)

NAMESPACES = isolation_works("namespaces")
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="namespace isolation needs root + util-linux")
# The kernel-enforced levels this machine offers ("namespaces": root; "userns": unprivileged user
# namespaces), each held to the same probes; "basic" always works.
KERNEL_LEVELS = [level for level in ("namespaces", "userns") if isolation_works(level)]
LEVELS = [*KERNEL_LEVELS, "basic"]


@pytest.fixture(scope="module")
def problem0() -> dict:
    return load_problems(1)[0]


@pytest.fixture(scope="module")
def good_program(problem0: dict) -> str:
    return program_for(problem0, problem0["canonical_solution"])


def _processes_of(result: SandboxResult) -> list[int]:
    """Live (non-zombie) processes still in the run's process group or running as its uid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            status = (entry / "status").read_text()
        except OSError:
            continue  # exited while we looked
        state, pgid = stat_fields[0], int(stat_fields[2])
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if state != "Z" and (pgid == result.pid or (result.uid is not None and uid == result.uid)):
            found.append(int(entry.name))
    return found


def _assert_contained_then_next_passes(result: SandboxResult, good_program: str, isolation: str) -> None:
    assert not result.passed
    assert result.status in ("failed", "timeout", "killed")
    assert _processes_of(result) == []
    after = run_untrusted(good_program, isolation=isolation, timeout_s=10)
    assert after.passed, after.detail


# ------------------------------------------------------------------------------------ correctness


@pytest.mark.parametrize("isolation", LEVELS)
def test_canonical_solution_passes_and_wrong_one_fails(problem0: dict, isolation: str) -> None:
    good = run_untrusted(program_for(problem0, problem0["canonical_solution"]), isolation=isolation)
    assert good.passed and good.status == "passed" and good.returncode == 0
    assert good.isolation == isolation
    wrong = run_untrusted(program_for(problem0, "    return False\n"), isolation=isolation)
    assert wrong.status == "failed"
    assert "AssertionError" in wrong.detail


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize(
    "escape",
    [
        "import sys\nsys.exit(0)",
        "raise SystemExit(0)",
        "import os\nos._exit(0)",
        "quit()",
        "print('passed')\nimport sys\nsys.exit(0)",
    ],
)
def test_exiting_early_in_the_check_is_not_passing(problem0: dict, isolation: str, escape: str) -> None:
    # The exit sits inside the function body, so it fires during check(), before any assert fails.
    body = "    " + escape.replace("\n", "\n    ") + "\n"
    result = run_untrusted(program_for(problem0, body), isolation=isolation)
    assert result.status == "failed", result
    assert not result.passed


def test_output_is_captured(problem0: dict) -> None:
    result = run_untrusted("print('hello from the sandbox')\nimport sys\nprint('err', file=sys.stderr)")
    assert result.passed
    assert "hello from the sandbox" in result.output and "err" in result.output


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "s3cr3t")
    result = run_untrusted(
        "import os\nassert 'SANDBOX_TEST_SECRET' not in os.environ, 'leaked'\n"
        "assert set(os.environ) <= {'PATH', 'HOME', 'LANG', 'LC_ALL', 'OMP_NUM_THREADS'}, sorted(os.environ)"
    )
    assert result.passed, result.detail


def test_bad_limits_and_isolation_raise_harness_errors() -> None:
    with pytest.raises(HarnessError, match="positive"):
        run_untrusted("x = 1", timeout_s=0)
    with pytest.raises(HarnessError, match="unknown isolation"):
        run_untrusted("x = 1", isolation="chroot")
    for level in ("namespaces", "userns"):
        if not isolation_works(level):
            with pytest.raises(UnsupportedError, match="does not work here"):
                run_untrusted("x = 1", isolation=level)


def test_protections_say_kernel_or_best_effort() -> None:
    for level in ISOLATIONS:
        table = protections(level)
        assert table and all(v.split(":")[0] in ("kernel", "best-effort", "runner") for v in table.values())
    assert protections("namespaces")["network"].startswith("kernel")
    assert protections("userns")["file deletion outside the sandbox"].startswith("kernel")
    assert protections("basic")["network"].startswith("best-effort")


# ------------------------------------------------------------------------------------------ hostile


@pytest.mark.parametrize("isolation", LEVELS)
def test_infinite_loop_times_out_within_the_limit(good_program: str, isolation: str) -> None:
    start = time.perf_counter()
    result = run_untrusted("while True:\n    pass", isolation=isolation, timeout_s=1.5)
    elapsed = time.perf_counter() - start
    assert result.status == "timeout"
    # Bounded, not precise: the process group is killed at the limit; on a loaded 2-core machine the
    # namespace teardown can take a few seconds more. What matters is that it never hangs.
    assert 1.5 <= result.duration_s < 1.5 + 5.0
    assert elapsed < 1.5 + 6.0
    _assert_contained_then_next_passes(result, good_program, isolation)


# RLIMIT_NPROC does not bind root's own processes, and in "userns" the program runs as the caller:
# as root that level has no kernel limit on processes, and an unguarded fork bomb would run for real.
NPROC_LEVELS = [level for level in KERNEL_LEVELS if level == "namespaces" or os.geteuid() != 0]


@pytest.mark.parametrize("isolation", NPROC_LEVELS)
def test_fork_bomb_is_stopped_by_the_kernel(good_program: str, isolation: str) -> None:
    bomb = "import os\nwhile True:\n    os.fork()"
    result = run_untrusted(bomb, isolation=isolation, python_guard=False, timeout_s=5, max_processes=16)
    if isolation == "namespaces":
        assert result.uid is not None and result.uid != 0
    _assert_contained_then_next_passes(result, good_program, isolation)


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_detached_children_die_with_the_sandbox(good_program: str, isolation: str) -> None:
    # setsid() leaves the process group; the PID namespace still takes the child down.
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = run_untrusted(program, isolation=isolation, python_guard=False)
    assert result.passed  # the parent finished normally...
    time.sleep(0.2)
    assert _processes_of(result) == []  # ...and nothing of it outlived the run


@pytest.mark.parametrize("isolation", LEVELS)
def test_guarded_fork_bomb_fails_at_once(good_program: str, isolation: str) -> None:
    result = run_untrusted("import os\nwhile True:\n    os.fork()", isolation=isolation, timeout_s=5)
    assert result.status == "failed" and "disabled" in result.detail
    _assert_contained_then_next_passes(result, good_program, isolation)


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize(
    "hog",
    ["x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**6))"],
    ids=["one", "grow"],
)
def test_memory_hog_is_stopped_without_hurting_the_parent(
    good_program: str, isolation: str, hog: str
) -> None:
    result = run_untrusted(hog, isolation=isolation, memory_mb=256, timeout_s=10)
    assert result.status in ("failed", "killed"), result
    if result.status == "failed":
        assert "MemoryError" in result.detail
    _assert_contained_then_next_passes(result, good_program, isolation)


def _rmtree_program(target: Path) -> str:
    return f"import shutil\nshutil.rmtree({str(target)!r})\n"


@pytest.mark.parametrize("isolation", LEVELS)
def test_guarded_rmtree_outside_the_sandbox_is_refused(
    tmp_path: Path, good_program: str, isolation: str
) -> None:
    victim = tmp_path / "keep"
    victim.mkdir()
    (victim / "data.txt").write_text("precious")
    result = run_untrusted(_rmtree_program(victim), isolation=isolation)
    assert (victim / "data.txt").read_text() == "precious"
    _assert_contained_then_next_passes(result, good_program, isolation)


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_unguarded_deletion_outside_the_sandbox_is_refused_by_the_kernel(
    tmp_path: Path, good_program: str, isolation: str
) -> None:
    victim = tmp_path / "keep"
    victim.mkdir()
    (victim / "data.txt").write_text("precious")
    victim.chmod(0o777)  # even a world-writable directory of the host stays out of reach
    (victim / "data.txt").chmod(0o666)
    program = _rmtree_program(victim) + f"import os\nos.remove({str(victim / 'data.txt')!r})\n"
    result = run_untrusted(program, isolation=isolation, python_guard=False)
    assert (victim / "data.txt").read_text() == "precious"
    _assert_contained_then_next_passes(result, good_program, isolation)


def _loopback_listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    return server


def _connect_program(port: int) -> str:
    return (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'escaped')\n"
    )


@pytest.mark.parametrize(
    ("isolation", "guard"),
    [(level, True) for level in LEVELS] + [(level, False) for level in KERNEL_LEVELS],
)
def test_no_connection_reaches_a_loopback_listener(good_program: str, isolation: str, guard: bool) -> None:
    server = _loopback_listener()
    try:
        port = server.getsockname()[1]
        result = run_untrusted(_connect_program(port), isolation=isolation, python_guard=guard)
        readable, _, _ = select.select([server], [], [], 0.5)
        assert readable == [], "a connection from the sandbox arrived"
        assert result.status == "failed"
    finally:
        server.close()
    _assert_contained_then_next_passes(result, good_program, isolation)


def test_listener_helper_does_accept_a_real_connection() -> None:
    # Guards the test above against passing because the listener could never see anything.
    server = _loopback_listener()
    try:
        client = socket.create_connection(server.getsockname(), timeout=2)
        readable, _, _ = select.select([server], [], [], 2)
        assert readable == [server]
        client.close()
    finally:
        server.close()


@pytest.mark.parametrize("isolation", LEVELS)
def test_huge_file_is_limited(good_program: str, isolation: str) -> None:
    program = "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * 10**6)\n"
    result = run_untrusted(program, isolation=isolation, python_guard=False, disk_mb=8)
    assert result.status == "failed" and "File too large" in result.detail
    _assert_contained_then_next_passes(result, good_program, isolation)


@pytest.mark.parametrize("isolation", LEVELS)
def test_flood_of_output_is_truncated_without_hanging(good_program: str, isolation: str) -> None:
    start = time.perf_counter()
    result = run_untrusted(
        "while True:\n    print('y' * 1000)", isolation=isolation, disk_mb=8, output_limit=500
    )
    assert time.perf_counter() - start < 10
    assert result.status == "failed"
    assert result.output.startswith("y" * 500)
    assert "more bytes of output dropped" in result.output and len(result.output) < 600
    # Output below the file limit is kept (truncated in the result) and does not fail the run.
    chatty = run_untrusted(
        "for _ in range(2000):\n    print('z' * 100)", isolation=isolation, output_limit=50
    )
    assert chatty.passed and chatty.output.startswith("z" * 50) and "dropped" in chatty.output
    _assert_contained_then_next_passes(result, good_program, isolation)


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_sandbox_runs_unprivileged_and_blind_to_the_host(isolation: str) -> None:
    program = (
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "caps = [line.split()[1] for line in status.splitlines() if line.startswith('Cap')]\n"
        "assert set(caps) == {'0000000000000000'}, caps\n"  # no capability of any kind
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        # Only itself and the namespace's first process (the shell waiting for it): host processes are
        # hidden, and the shell, which keeps every capability of the namespace, is not open to it.
        "assert pids == [1, os.getpid()] and os.getppid() == 1, pids\n"
        "for path in ('/proc/1/fd/0', '/proc/1/environ', '/proc/1/mem'):\n"
        "    try:\n        open(path, 'rb').read(1)\n    except PermissionError:\n        continue\n"
        "    raise AssertionError(f'{path} of the first process is open to the program')\n"
        "assert os.getcwd() == '/tmp/work'\n"
        "open('scratch.txt', 'w').write('ok')\n"
    )
    if isolation == "namespaces":
        program += "assert os.getuid() != 0 and os.getgid() != 0 and os.getgroups() == []\n"
    result = run_untrusted(program, isolation=isolation, python_guard=False)
    assert result.passed, result.detail


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_no_host_path_is_writable(isolation: str, good_program: str) -> None:
    """Writes anywhere on the host (the on-disk /run/lock, a world-writable folder in the caller's
    home, /etc, the project) land in throwaway tmpfs or fail: nothing outlives the run."""
    name = f"sandbox-probe-{os.getpid()}-{isolation}"
    open_dir = Path.home() / name
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    targets = [Path("/run/lock") / name, open_dir / "x", Path("/etc") / name, Path.cwd() / name]
    program = "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x' * 1000)\nexcept OSError:\n    pass\n" for t in targets
    )
    try:
        result = run_untrusted(program, isolation=isolation, python_guard=False)
        assert result.passed, result.detail
        assert [t for t in targets if t.exists()] == []
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
        open_dir.rmdir()
    assert run_untrusted(good_program, isolation=isolation).passed


@pytest.mark.skipif(not isolation_works("userns"), reason="unprivileged user namespaces are off here")
def test_userns_hides_the_callers_files_and_the_parents_nonce() -> None:
    """Running as the caller outside, the program still cannot read the project, the caller's home
    or the cache, nor reach its parent's open files (where the nonce is) through /proc."""
    from harness.weights import packaged

    project, cache = Path(__file__).resolve().parents[1], str(packaged.cache_root())
    program = (
        "import os\n"
        f"assert not os.path.exists({str(project / 'pyproject.toml')!r})\n"
        f"assert not os.path.exists({cache!r}) or not os.listdir({cache!r})\n"
        # Its parent is the namespace's first process; nothing of the host is in its /proc.
        "assert os.getppid() == 1\n"
        "assert sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()]\n"
    )
    result = run_untrusted(program, isolation="userns", python_guard=False)
    assert result.passed, result.detail


# ------------------------------------------------------------------------------------ an adversary


def _problem(task: int) -> dict:
    from harness.experiments.humaneval import load_problems

    return load_problems(task + 1)[task]


# Completions that passed scoring when the check shared the program's process: each reaches the
# verdict without solving the problem. (HumanEval/0 unless the id says otherwise.)
FORGERIES = {
    # A builtin the runner looked up at call time, replaced by the program.
    "builtins-dict": "    return Yes()\nimport builtins\nclass Yes:\n    def __eq__(self, other):\n"
    "        return True\n    def keys(self):\n        return []\n    def values(self):\n        return []\n"
    "builtins.dict = Yes\n",
    # A module-level name the check uses (HumanEval/2 checks with abs).
    "globals-abs@2": "    return 0.0\nabs = lambda x: 0\n",
    # The runner's own frame: its report function and its exit.
    "runner-frame": "    return False\nimport sys\nf = sys._getframe(1).f_locals\n"
    "f['report']('passed', 'passed')\nf['exit_now'](0)\n",
    # The same through the garbage collector.
    "gc-objects": "    return False\nimport gc, os\nfor o in gc.get_objects():\n"
    "    if callable(o) and getattr(o, '__name__', '') == 'report':\n        o('passed', 'passed')\n"
    "        os._exit(0)\n",
}


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_pass_is_not_scored(isolation: str, name: str) -> None:
    """The verdict is the check's, run on the trusted side on the values the program sent back:
    nothing the program does to its own process reaches it."""
    from harness.experiments import humaneval as he

    problem = _problem(int(name.split("@")[1]) if "@" in name else 0)
    (forged,) = he.run_scored([(problem, FORGERIES[name])], isolation=isolation)
    assert forged.status == "failed" and not forged.passed, forged
    (honest,) = he.run_scored([(problem, problem["canonical_solution"])], isolation=isolation)
    assert honest.passed, honest.detail


def _run_processes(result: SandboxResult) -> list[str]:
    """Live processes of the run, found by the tag its runner's command line carries."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and result.tag in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(entry.name)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_a_process_that_leaves_the_session_does_not_outlive_the_run(isolation: str) -> None:
    """setsid() leaves the process group the parent kills, and the uid change cleared the death
    signal unshare set: the namespace's first process is a waiting shell, so nothing stays."""
    result = run_untrusted(
        "import posix, time\nposix.setsid()\ntime.sleep(10**6)\n",
        isolation=isolation,
        python_guard=False,
        timeout_s=2,
    )
    assert result.status == "timeout" and result.tag
    time.sleep(0.2)
    assert _run_processes(result) == []
    assert _processes_of(result) == []


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_host_unix_sockets_are_unreachable(isolation: str, tmp_path: Path) -> None:
    """A listening socket under /run (a session bus, an agent, a container daemon lives there) is not
    there for the program: /run is an empty tmpfs inside the sandbox."""
    folder = Path("/run") if os.access("/run", os.W_OK) else Path(os.environ.get("XDG_RUNTIME_DIR", ""))
    if not folder.is_absolute() or not os.access(folder, os.W_OK):
        pytest.skip("no writable folder under /run for a listening socket")
    path = folder / f"sandbox-test-{os.getpid()}.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)
    program = (
        "import _socket\ns = _socket.socket(_socket.AF_UNIX)\n"
        f"try:\n    s.connect({str(path)!r})\nexcept OSError:\n    pass\n"
        "else:\n    raise SystemExit('reached the host socket')\n"
    )
    try:
        result = run_untrusted(program, isolation=isolation, python_guard=False)
        reached = select.select([listener], [], [], 0.2)[0]
    finally:
        listener.close()
        path.unlink(missing_ok=True)
    assert result.passed, result.detail
    assert not reached


MEMORY_SPLIT = """
import os, time
r, w = os.pipe()
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(600 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(w, b"x")
        time.sleep(5)
        os._exit(0)
os.close(w)
held = 0
while held < 4 and os.read(r, 1):
    held += 1
print("held", held)
if held == 4:
    raise SystemExit("four processes held 600 MB each at once")
"""


@needs_namespaces
@pytest.mark.skipif(
    not cgroup_available(), reason="no memory cgroup can be made here (not root, none delegated)"
)
def test_memory_is_capped_for_the_run_not_per_process() -> None:
    """Four processes under a 1 GiB per-process cap held 2.4 GB of the host's memory together; the
    run's cgroup caps them together, so at most one of them gets its 600 MB."""
    result = run_untrusted(MEMORY_SPLIT, isolation="namespaces", python_guard=False, timeout_s=20)
    assert result.passed, (result.detail, result.output)
    assert "held 4" not in result.output


def _held_kb() -> int:
    """Memory processes hold that no cache pressure gives back: anonymous pages and tmpfs pages."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return sum(int(fields[name].split()[0]) for name in ("AnonPages", "Shmem"))


@pytest.mark.parametrize("isolation", KERNEL_LEVELS)
def test_after_hostile_scoring_nothing_remains_and_memory_is_back(isolation: str, pytestconfig) -> None:
    from harness.experiments import humaneval as he
    from harness.pytest_plugin import under_xdist

    problem = _problem(0)
    hostile = [
        "    return False\nimport posix, time\nposix.setsid()\ntime.sleep(10**6)\n",
        "    return False\nimport posix, time\nif posix.fork() == 0:\n    posix.setsid()\n"
        "    block = bytearray(300 * 1024 * 1024)\n    time.sleep(10**6)\n",
        "    return False\nblock = bytearray(500 * 1024 * 1024)\nwhile True:\n    pass\n",
        FORGERIES["runner-frame"],
    ]
    before = _held_kb()
    results = he.run_scored([(problem, c) for c in hostile], isolation=isolation, timeout_s=3)
    assert not any(r.passed for r in results), [r.detail for r in results]
    assert all(_run_processes(r) == [] and _processes_of(r) == [] for r in results)
    if under_xdist(pytestconfig):
        # Another worker's tests allocate and free beside this one, and the measure is the machine's.
        pytest.skip("the memory check reads the whole machine's memory and runs serially; run without -n")
    # Within 200 MB: nothing is holding the hogs' 0.8 GB of anonymous memory (or any of it as
    # tmpfs pages). MemAvailable was the measure once, but it moves with the page cache by 0.1-0.4 GB
    # within seconds on a host with a large cache, whatever the sandbox does.
    time.sleep(0.3)
    assert _held_kb() < before + 200 * 1024, (_held_kb() - before) // 1024


NON_ROOT_CHECK = """
import sys
from harness.experiments import humaneval as he
from harness.sandbox.sandbox import available_isolation, run_untrusted
assert available_isolation() == "userns", available_isolation()
problem = he.load_problems(1)[0]
forged = (
    "    return False\\nimport sys\\nf = sys._getframe(1).f_locals\\n"
    "f['report']('passed', 'passed')\\nf['exit_now'](0)\\n"
)
assert not he.run_scored([(problem, forged)])[0].passed
assert he.run_scored([(problem, problem["canonical_solution"])])[0].passed
sleeper = "import posix, time\\nposix.setsid()\\ntime.sleep(10**6)\\n"
r = run_untrusted(sleeper, python_guard=False, timeout_s=2)
print("TAG", r.tag, r.status)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="making a throwaway user needs root")
def test_the_unprivileged_level_holds_for_a_throwaway_user(tmp_path: Path) -> None:
    """What a non-root user gets ("userns"), run as a uid made for the test: a forged pass fails, an
    honest one passes, and a process that left the session does not outlive its run."""
    import shutil
    import subprocess

    from harness.sandbox.sandbox import _hidden_ancestor, _interpreter

    python, prefix = _interpreter()
    hidden = _hidden_ancestor(prefix) or _hidden_ancestor(str(Path(__file__).resolve().parents[1]))
    if hidden:
        pytest.skip(f"the interpreter or the project lives under {hidden}, which another uid cannot reach")
    if not shutil.which("setpriv"):
        pytest.skip("util-linux setpriv is not installed")
    uid = str(1_400_000_000 + os.getpid())
    project = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", python, "-c", NON_ROOT_CHECK],
        cwd=project, capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": project},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    tag = done.stdout.split("TAG ", 1)[1].split()[0]
    time.sleep(0.2)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and tag in _cmdline(p)]
    assert left == [], left


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@needs_namespaces
def test_without_a_cgroup_a_run_holds_at_most_four_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cgroup can be made, the run's memory is bounded by fewer processes instead: at most
    four, each under RLIMIT_AS."""
    from harness.sandbox import sandbox

    monkeypatch.setattr(sandbox._Cgroup, "make", classmethod(lambda cls, tag, memory_mb: None))
    program = (
        "import os, time\nmade = 0\nfor _ in range(8):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
        "    made += 1\nprint('made', made)\nif made >= 4:\n    raise SystemExit(f'{made} children')\n"
    )
    result = run_untrusted(
        program, isolation="namespaces", python_guard=False, max_processes=32, timeout_s=10
    )
    assert result.passed, (result.detail, result.output)
    assert "made 3" in result.output
