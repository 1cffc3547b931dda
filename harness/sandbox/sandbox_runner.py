"""The trusted runner the sandbox ships to its child (``harness.sandbox.sandbox``), as source.

It runs inside the contained child with ``python -I -S``: everything it needs it imports itself and
the standard library only. Kept in a module of its own so ``inspect.getsource`` ships exactly it;
the parent imports ``decode_value`` from here, so both sides read one encoding.
"""

from __future__ import annotations

# A candidate's results and arguments cross between the scored program and the trusted check as JSON,
# with the types JSON lacks tagged (a one-key object), so the check compares the values the candidate
# returned and nothing of the program's own: no object of its class, no method of its making, can
# reach the process that decides the verdict. Written here because pickle would run the program's
# code on loading, and json alone turns tuples into lists (which compare unequal).
_TAGS = ("t", "s", "fs", "d", "b", "c")
MAX_DEPTH = 200


def encode_value(value: object, budget: int = 1_000_000) -> object:
    """``value`` as JSON-able data; exact builtin types only (a subclass could answer ``==`` as it
    likes), at most ``budget`` values and ``MAX_DEPTH`` levels."""
    count = [0]

    def walk(item: object, depth: int) -> object:
        count[0] += 1
        if count[0] > budget or depth > MAX_DEPTH:
            raise TypeError("the candidate returned a structure too large or too deep to compare")
        kind = type(item)
        if item is None or kind in (bool, int, float, str):
            return item
        if kind is list:
            return [walk(x, depth + 1) for x in item]
        if kind is tuple:
            return {"t": [walk(x, depth + 1) for x in item]}
        if kind is set or kind is frozenset:
            return {"s" if kind is set else "fs": [walk(x, depth + 1) for x in item]}
        if kind is dict:
            return {"d": [[walk(k, depth + 1), walk(v, depth + 1)] for k, v in item.items()]}
        if kind is bytes:
            return {"b": item.hex()}
        if kind is complex:
            return {"c": [item.real, item.imag]}
        raise TypeError(
            f"the candidate returned a {kind.__name__}, not a plain value (numbers, strings, bytes, None "
            "and builtin containers of them); results are compared with ==, which such an object can "
            "answer as it likes"
        )

    return walk(value, 0)


def decode_value(data: object, depth: int = 0) -> object:
    """The value ``encode_value`` wrote; anything else (an unknown tag, an unhashable key) is a
    ValueError: the bytes come from an untrusted process."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_value(x, depth + 1) for x in data]
    if type(data) is dict and len(data) == 1:
        ((tag, body),) = data.items()
        if tag in ("t", "s", "fs") and type(body) is list:
            items = [decode_value(x, depth + 1) for x in body]
            try:
                return {"t": tuple, "s": set, "fs": frozenset}[tag](items)
            except TypeError as exc:  # an unhashable member of a set
                raise ValueError(str(exc)) from None
        if tag == "d" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            try:
                return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in body}
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
            return complex(body[0], body[1])
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


def _runner_main() -> None:  # pragma: no cover - runs only inside the sandboxed child
    """Trusted runner: executes the program from stdin, reports the outcome on the status fd.

    Shipped as source via `python -c` (with this module's other functions), so it imports everything
    itself and must stay stdlib-only. Whatever it needs after the guard is captured in locals first.

    With ``serve`` in the payload (a function's name) it then answers calls of that function, one
    JSON line per call on its request fd, with the encoded result or the exception's name on its
    reply fd, until the request fd closes: the check runs in the parent, which decides the verdict.
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
    status_fd, request_fd, reply_fd = (int(fd) for fd in sys.argv[1].split(",")[:3])
    nonce = payload.pop("nonce")
    program = payload.pop("program")
    serve = payload.pop("serve", None)
    write, getpid, exit_now, dumps, loads = os.write, os.getpid, os._exit, json.dumps, json.loads
    encode, decode, read_line = encode_value, decode_value, os.fdopen(request_fd, "rb").readline
    me = getpid()

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
        candidate = namespace[serve] if serve is not None else None
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: exiting early is not passing
        report("failed", f"failed: {type(exc).__name__}: {exc}"[:2000])
        exit_now(1)
    while candidate is not None:
        line = read_line()
        if not line:
            break  # the check is done
        try:
            args, kwargs = decode(loads(line))
            answer = ["ok", encode(candidate(*args, **kwargs))]
        except BaseException as exc:  # noqa: BLE001 - the check sees the candidate's exception by name
            answer = ["raised", type(exc).__name__, str(exc)[:500]]
        flush_stdio()
        write(reply_fd, dumps(answer).encode() + b"\n")
    report("passed", "passed")
    exit_now(0)
