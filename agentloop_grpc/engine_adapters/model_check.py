"""Is the model an engine config names there to load? Checked before a server listens or a launcher spawns one.

A server announces itself before it loads its model (health says NOT_SERVING meanwhile), so a model folder that
is not there would otherwise show up as a server that printed "listening" and died. These checks only look at
files (no torch, no transformers): a missing folder, a Hugging Face Hub id (engines never download at run time),
a folder without ``config.json`` or ``*.safetensors``, and for the default model the package it is prepared from.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentloop_grpc.common import model_store

from .config import EngineConfig
from .config_base import LocalModelConfig

#: What a Hub id looks like (``owner/name``); a path of that shape that exists on disk is a path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelNotFoundError(ValueError):
    """The model an engine config names cannot be loaded from this machine; the message says what to do."""


def check_model(config: EngineConfig) -> None:
    """ModelNotFoundError unless ``config``'s model can be loaded here; engines without a local model (SGLang's
    actors, the fake) pass."""
    if not isinstance(config, LocalModelConfig):
        return
    if config.model is None:
        if not model_store.is_checkpoint(model_store.default_checkpoint_dir(config.cache_dir)):
            try:
                model_store.default_gguf_path()
            except FileNotFoundError as error:
                raise ModelNotFoundError(f"model: none given, and {error}") from None
        return
    folder = Path(config.model).expanduser()
    if not folder.exists():
        if _HUB_ID.fullmatch(config.model):
            name = config.model.rsplit("/", 1)[1]
            raise ModelNotFoundError(
                f"model {config.model!r}: no such folder. If it is a Hugging Face Hub id: engines load local "
                f"folders only (nothing is downloaded at run time); download it once, e.g. "
                f"`hf download {config.model} --local-dir models/{name}`, and give that folder as the model (--model "
                f"models/{name})"
            )
        raise ModelNotFoundError(f"model {config.model!r}: no such folder")
    if not folder.is_dir():
        raise ModelNotFoundError(f"model {config.model!r} is a file; give the checkpoint's folder")
    missing = [what for what, present in (("config.json", (folder / "config.json").is_file()),
                                          ("*.safetensors weights", any(folder.glob("*.safetensors"))))
               if not present]
    if missing:
        raise ModelNotFoundError(
            f"model {config.model!r} has no {' and no '.join(missing)}: not a Hugging Face checkpoint folder "
            f"(config.json + *.safetensors)"
        )
