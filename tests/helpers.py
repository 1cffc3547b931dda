"""What several test modules share: loading a pair from settings as a user spells them."""

from __future__ import annotations

from typing import Any

from harness.decoding import engines
from harness.pairs import models
from harness.settings import setup


def load_pair(name: str | models.PairSpec = models.DEFAULT_PAIR, **settings: Any) -> models.LoadedPair:
    """Pair ``name`` with ``settings`` (``setup.resolve``'s keywords; ``weights_dir`` too) resolved
    once, as the CLI and the plugin do, and loaded by its engine."""
    weights_dir = settings.pop("weights_dir", None)
    spec = models.get_pair(name)
    return engines.load(spec, setup.resolve(spec, **settings), weights_dir=weights_dir)
