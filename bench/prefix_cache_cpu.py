"""CPU cost of the embedded engine's prefix cache inside its scheduler, without a model.

The scheduler runs with a stub runner (zero logits, KV reads of an empty tensor), so what a step costs is the
scheduler's own work: admission (prefix-cache keys, lookups, the shared-prefix deferral rule), prefill chunking,
storing prompt and output blocks. Workload: 16 multi-turn sessions x 4 turns sharing a 1,500-token system
prompt; turn 1 is 2,000 tokens, each later turn adds 16 generated and 600 new tokens (up to ~3,850 tokens);
8 slots, 256-token prefill chunks, 16-token blocks. Prints the median CPU time of the scheduler's thread over the
whole workload (CPU time: the machine is shared, wall time is not reproducible) and the cached prompt tokens
(equal before and after a change that keeps the cache's behaviour).

Not part of run_all.py: its baseline is another checkout, e.g. ``git archive HEAD agentloop_grpc | tar -x -C
/tmp/head`` then ``PYTHONPATH=/tmp/head .venv/bin/python bench/prefix_cache_cpu.py``.

Usage: python bench/prefix_cache_cpu.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentloop_grpc.common.types import GenerateRequest, SamplingParams
from agentloop_grpc.engine_adapters.embedded.prefix_cache import PrefixCache
from agentloop_grpc.engine_adapters.embedded.scheduler import Scheduler
from agentloop_grpc.engine_adapters.embedded.sequence import Sequence

SESSIONS, TURNS, NEW_TOKENS, VOCAB = 16, 4, 16, 64
SYSTEM, FIRST_USER, NEXT_USER = 1500, 500, 600


class _StubKV:
    def __init__(self) -> None:
        self._blocks: dict[int, torch.Tensor] = {}

    def read(self, slot: int, start: int, end: int) -> torch.Tensor:
        return self._blocks.setdefault(end - start, torch.empty(1, 1, 1, end - start, 1))

    def write(self, slot: int, start: int, block: torch.Tensor) -> None:
        pass

    def move(self, src: int, dst: int, length: int) -> None:
        pass


class _StubRunner:
    def __init__(self) -> None:
        self.kv = _StubKV()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, first_row: int, kv_len: int) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], VOCAB)


def _workload() -> tuple[float, int]:
    """CPU seconds the scheduler spent on every turn of every session, and the prompt tokens served from the cache."""
    scheduler = Scheduler(_StubRunner(), PrefixCache(16, 32_768), frozenset(), 8, 4096, 256, VOCAB)
    system = list(range(1000, 1000 + SYSTEM))
    prompts = [system + [5000 + 1000 * s + i for i in range(FIRST_USER)] for s in range(SESSIONS)]
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    elapsed, cached, arrival = 0.0, 0, 0
    for turn in range(TURNS):
        sequences = []
        for session, prompt in enumerate(prompts):
            request = GenerateRequest(f"s{session}-t{turn}", tuple(prompt), sampling)
            sequences.append(Sequence(request, None, arrival, list(request.prompt_ids)))
            arrival += 1
        started = time.thread_time()
        for sequence in sequences:
            scheduler.submit(sequence)
        while scheduler.has_work():
            scheduler.step()
        elapsed += time.thread_time() - started
        cached += sum(s.cached for s in sequences)
        fresh = 100_000 * (turn + 1)
        prompts = [
            s.tokens + [fresh + 1000 * i + j for j in range(NEXT_USER)] for i, s in enumerate(sequences)
        ]
    return elapsed, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _workload()  # warm-up
    runs = [_workload() for _ in range(args.repeats)]
    seconds = [s for s, _ in runs]
    requests = SESSIONS * TURNS
    median = statistics.median(seconds)
    print(f"workload: median {median * 1e3:.1f} ms, {median / requests * 1e6:.0f} us per request "
          f"(runs {[round(s * 1e3, 1) for s in seconds]} ms); cached prompt tokens {sorted({c for _, c in runs})}")


if __name__ == "__main__":
    main()
