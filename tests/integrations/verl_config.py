"""verl's own trainer config (its Hydra ``ppo_trainer``), composed with overrides as a verl user's command line
gives them: tests see the config verl's classes really get, every default and ``_target_`` included."""

from __future__ import annotations

import os
from collections.abc import Sequence


def verl_config(overrides: Sequence[str]):
    import verl
    from hydra import compose, initialize_config_dir

    folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=folder, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))
