"""The seeds' entry point: ``python assisted_generation.py --model_name ... --task ...``."""

import signal
import sys

interrupted = []


def _on_interrupt(signum, frame):
    # Ctrl-C while the libraries import can surface as another error (numpy's "cannot load module
    # more than once", an import error of transformers' lazy modules); remember that it came.
    interrupted.append(signum)
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_interrupt)
try:
    from harness.cli import main
except (Exception, KeyboardInterrupt):
    if not interrupted:
        raise
    print("interrupted while starting; nothing had started", file=sys.stderr)
    sys.exit(130)
if interrupted:  # a library caught it while importing and went on: it was still asked for
    print("interrupted while starting; nothing had started", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
