"""The trusted runner the sandbox ships to its child (``harness.sandbox``), as source.

It runs inside the contained child with ``python -I -S``: everything it needs it imports itself and
the standard library only. Kept in a module of its own so ``inspect.getsource`` ships exactly it.
"""

from __future__ import annotations


def _runner_main() -> None:  # pragma: no cover - runs only inside the sandboxed child
    """Trusted runner: executes the program from stdin, reports the outcome on the status fd.

    Shipped as source via `python -c`, so it imports everything itself and must stay stdlib-only.
    Whatever it needs after the guard is captured in locals first.
    """
    import builtins
    import json
    import os
    import resource
    import signal
    import sys

    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the program gets an empty stdin, not the payload
    os.close(null)
    status_fd = int(sys.argv[1])
    nonce = payload.pop("nonce")
    program = payload.pop("program")
    check_call = payload.pop("check_call", None)
    write, getpid, exit_now, dumps = os.write, os.getpid, os._exit, json.dumps
    type_of, plain_types = type, (int, float, complex, str, bytes, bool, type(None))
    sequences = (list, tuple, set, frozenset)
    me = getpid()

    def plain(value: object) -> None:
        # Exact builtin types only, walked without recursion: a value of the program's own class
        # (or a subclass of int, str, ...) could define __eq__ to agree with anything.
        stack, seen = [value], 0
        while stack:
            item = stack.pop()
            kind = type_of(item)
            seen += 1
            if seen > 1_000_000:
                raise TypeError("the candidate returned a structure of over a million values")
            if kind in plain_types:
                continue
            if kind is dict:
                stack.extend(dict.keys(item))
                stack.extend(dict.values(item))
            elif kind in sequences:
                stack.extend(item)
            else:
                raise TypeError(
                    "the candidate returned an object of a class it defined or derived; results are "
                    "compared with ==, which such an object can answer as it likes"
                )

    for name, value in payload["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    # An over-long write should fail as an exception the report can name, not kill silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    if payload["guard"]:

        def disabled(name: str):  # type: ignore[no-untyped-def]
            def refuse(*args: object, **kwargs: object) -> None:
                raise PermissionError(f"{name} is disabled inside the sandbox")

            return refuse

        import shutil
        import socket
        import subprocess

        os.environ["OMP_NUM_THREADS"] = "1"
        os_names = (
            "kill", "killpg", "system", "popen", "putenv", "remove", "removedirs", "rmdir", "unlink",
            "rename", "renames", "replace", "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown",
            "lchown", "chroot", "chdir", "fchdir", "setuid", "setgid", "setsid", "fork", "forkpty",
            "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv",
            "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn",
            "posix_spawnp",
        )  # fmt: skip
        for attr in os_names:
            if hasattr(os, attr):
                setattr(os, attr, disabled(f"os.{attr}"))
        for attr in ("rmtree", "move", "chown"):
            setattr(shutil, attr, disabled(f"shutil.{attr}"))
        for attr in ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
            setattr(subprocess, attr, disabled(f"subprocess.{attr}"))
        for attr in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
            setattr(socket, attr, disabled(f"socket.{attr}"))
        builtins.help = disabled("help")
        for module in ("ipdb", "joblib", "resource", "psutil", "tkinter", "multiprocessing"):
            sys.modules[module] = None  # import now raises ImportError

    def report(status: str, detail: str) -> None:
        flush_stdio()
        if getpid() != me:
            exit_now(1)  # a process the program forked never speaks for the run
        write(status_fd, dumps({"status": status, "detail": detail, "nonce": nonce}).encode())

    def flush_stdio() -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001,S110 - the program may have replaced or closed them
                pass

    try:
        namespace = {"__name__": "__sandbox__"}
        exec(compile(program, "<program>", "exec"), namespace)  # noqa: S102
        if check_call is not None:
            # The runner, not the program, calls the check: on a candidate whose every result must
            # be a plain value (see plain above).
            check, candidate = namespace[check_call[0]], namespace[check_call[1]]

            def guarded(*args: object, **kwargs: object) -> object:
                result = candidate(*args, **kwargs)
                plain(result)
                return result

            check(guarded)
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: exiting early is not passing
        report("failed", f"failed: {type(exc).__name__}: {exc}"[:2000])
        exit_now(1)
    report("passed", "passed")
    exit_now(0)
