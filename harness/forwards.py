"""``python -m harness.forwards``: the command the README names, kept where users type it; the tool
lives in ``harness.experiments.forwards``."""

from harness.experiments.forwards import main

if __name__ == "__main__":
    raise SystemExit(main())
