"""The seeds' entry point: ``python assisted_generation.py --model_name ... --task ...``."""

import signal
import sys

interrupted = []


def _note_interrupt(signum, frame):
    # Ctrl-C while the libraries import is noted, not raised: an exception raised inside a C
    # extension's initialisation surfaced as other errors (an import error of transformers' lazy
    # modules, numpy's "cannot load module more than once") or aborted the process (SIGABRT).
    interrupted.append(signum)


signal.signal(signal.SIGINT, _note_interrupt)
from harness.cli import main  # noqa: E402 - after the handler, so an interrupt while importing is kept

if interrupted:
    print("interrupted while starting; nothing had started", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
