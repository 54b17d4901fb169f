"""Structured output through xgrammar: compile a constraint once, then one matcher per request.

xgrammar compiles JSON schemas, regexes and EBNF grammars against the tokenizer's vocabulary (and caches the
result, bounded in bytes); a ``GrammarMatcher`` then yields, at each step, the bitmask of tokens that keep the
output inside the language. The engine turns the bitmask into a boolean row applied to the logits before
sampling and feeds every sampled token back (``accept``). When the grammar is complete the matcher only allows
the stop token (eos); accepting it terminates the matcher and the request ends with STOP.

JSON is compiled without free whitespace (``any_whitespace=False``): with it, a small model spends its tokens
on blanks and rarely closes strings.
"""

from __future__ import annotations

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from ..errors import InvalidRequestError
from ..types import StructuredOutput


class GrammarCompiler:
    """Compiles constraints against one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, cache_bytes: int, threads: int) -> None:
        self.vocab_size = vocab_size
        self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=threads, cache_limit_bytes=cache_bytes)

    def compile(self, constraint: StructuredOutput) -> xgr.CompiledGrammar:
        """Compile ``constraint``; InvalidRequestError names the field when it does not compile."""
        try:
            if constraint.kind == "json_schema":
                return self._compiler.compile_json_schema(constraint.spec, any_whitespace=False)
            if constraint.kind == "regex":
                return self._compiler.compile_regex(constraint.spec)
            return self._compiler.compile_grammar(constraint.spec)
        except (RuntimeError, ValueError) as error:
            raise InvalidRequestError(f"structured_output.{constraint.kind} does not compile: {error}") from error


class StructuredState:
    """One request's position in its grammar."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size

    def allowed(self) -> torch.Tensor:
        """Boolean row: the tokens the grammar allows next."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = torch.zeros(1, self._vocab_size, dtype=torch.float32)
        xgr.apply_token_bitmask_inplace(row, self._bitmask, vocab_size=self._vocab_size)
        return row[0] == 0.0

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"the grammar matcher rejected token {token}, which its own bitmask allowed")

    @property
    def terminated(self) -> bool:
        return self._matcher.is_terminated()
