"""``python -m harness.trees``: the command the README names; the tool lives in
``harness.experiments.trees``."""

from harness.experiments.trees import main

if __name__ == "__main__":
    raise SystemExit(main())
