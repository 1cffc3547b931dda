"""``python -m harness.row_divergence``: the command the README names, kept where users type it; the tool
lives in ``harness.experiments.row_divergence``."""

from harness.experiments.row_divergence import main

if __name__ == "__main__":
    raise SystemExit(main())
