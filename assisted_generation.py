"""The seeds' entry point: ``python assisted_generation.py --model_name ... --task ...``."""

import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
