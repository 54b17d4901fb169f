"""The loops' tokenizer must be the engines': ids mean nothing across two vocabularies.

Every engine reports its tokenizer's fingerprint in GetServerInfo; the loops encode prompts and tool turns with
their own tokenizer (``WorkerSpec.model_dir``, the default model's when unset). A mismatch would feed one model
another model's ids without any error, so it is refused before the first rollout. An engine without a tokenizer
(the fake engine) or one that reports no fingerprint is checked on the vocabulary size only.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentloop_grpc.common.tokenizer_fingerprint import tokenizer_fingerprint
from agentloop_grpc.common.types import EngineState
from agentloop_grpc.router import ServerInfo


class TokenizerMismatchError(ValueError):
    """An engine server's tokenizer is not the loops' tokenizer."""


def check_engine_tokenizers(tokenizer, infos: Mapping[str, ServerInfo], model_dir: str | None) -> int:
    """Raise TokenizerMismatchError naming the first server whose tokenizer differs; return servers checked.

    ``infos`` maps server addresses to their GetServerInfo answers (``Fleet.server_info``; servers that did not
    answer are left out: they are the router's business, not a mismatch); a server still loading has no tokenizer
    yet and is skipped.
    """
    ours = tokenizer_fingerprint(tokenizer)
    source = model_dir or "the default model"
    checked = 0
    for address, info in sorted(infos.items()):
        if info.state is EngineState.LOADING:
            continue
        checked += 1
        if info.engine_kind == "fake" or not info.tokenizer_fingerprint:
            if len(tokenizer) > info.vocab_size:
                raise TokenizerMismatchError(
                    f"engine server {address} has a vocabulary of {info.vocab_size} ids, the loops' tokenizer "
                    f"({source}) has {len(tokenizer)}"
                )
        elif info.tokenizer_fingerprint != ours:
            raise TokenizerMismatchError(
                f"engine server {address} serves {info.model_id!r} with tokenizer {info.tokenizer_fingerprint}, "
                f"but the loops tokenize with {source} ({ours}): set model_dir to the engines' model folder"
            )
    return checked
