"""``python -m harness.seeds``: the command the README names, kept where users type it; the tool
lives in ``harness.settings.seeds``."""

from harness.settings.seeds import main

if __name__ == "__main__":
    raise SystemExit(main())
