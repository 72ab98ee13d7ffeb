"""ksearch-ray: K-Search (LLM kernel search with a co-evolving world model) on Ray."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__version__ = "0.1.0"

# The repository keeps the Ray actor classes in a top-level `actors/` folder (the design card's
# layout); an install maps it to `ksearch_ray.actors` (pyproject's package-dir), because a
# top-level `actors` package would collide with an unrelated PyPI project. In a plain checkout
# (e.g. `ray job submit --working-dir .`) there is no mapping, so this finder provides it.
_CHECKOUT_ACTORS = Path(__file__).resolve().parent.parent / "actors"


class _CheckoutActorsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "ksearch_ray.actors":
            return None
        return importlib.util.spec_from_file_location(
            name, _CHECKOUT_ACTORS / "__init__.py", submodule_search_locations=[str(_CHECKOUT_ACTORS)]
        )


if (_CHECKOUT_ACTORS / "__init__.py").is_file() and not (Path(__file__).parent / "actors").is_dir():
    sys.meta_path.append(_CheckoutActorsFinder())
