"""The loop of the tool-partition test, run inside ``agentloop rollout`` as a custom loop (``loops: {gated: {path:
tests.cluster.tool_fault_loop:GatedToolLoop, kwargs: {gate_dir: ..., early: N}}}``).

It is the real ToolLoop with two changes for the test:
  - the fake engine's tokens are no tool calls, so a parser reads the first turn of a sample offered tools as one
    ``calculator`` call (the tokens are kept as the engine made them; only what the loop does with them changes) and
    later turns as no call: such a sample makes a CreateInstance, an Execute, a second turn, a CalcReward and a
    ReleaseInstance; a sample offered no tools generates one turn and never reaches the tool server;
  - a gate: samples whose id starts with ``early`` run at once; those whose id starts with ``mid`` run at once too,
    but their Execute waits for ``gate_dir/go`` (their instance made before it); the others wait for ``gate_dir/go``
    to start. Once ``early`` samples have ended and ``mid`` samples wait, the loop writes ``gate_dir/ready`` (the test
    partitions the tool server's node, then writes ``go``).
Every tool call (method, start, end, outcome) and every trajectory's end go to ``gate_dir/events.jsonl``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from agentloop_grpc.agent.context import LoopContext
from agentloop_grpc.agent.loops.tool_loop import ToolLoop
from agentloop_grpc.agent.parsers import ParsedTurn, ToolCall
from agentloop_grpc.agent.sample import Sample
from agentloop_grpc.agent.trajectory import Trajectory

#: What the first turn of a sample with tools is read as.
CALL = ToolCall("calculator", {"expression": "6 * 7"})


class _FirstTurnCalls:
    """A parser for one sample: its first turn is one CALL (when ``calls``), every later turn none."""

    name = "first_turn_calls"
    stop_tokens: tuple[str, ...] = ()

    def __init__(self, calls: bool) -> None:
        self._calls = calls

    def parse(self, text: str) -> ParsedTurn:
        if self._calls:
            self._calls = False
            return ParsedTurn(text, (CALL,))
        return ParsedTurn(text)

    def settled_content(self, text: str) -> str:
        return ""

    def constraint(self, tools: Any, max_calls: int) -> str:
        raise NotImplementedError("no grammar: the fake engine takes none")


class _Recorded:
    """The worker's tool client, every call on record; ``before(method, args)`` is awaited before each call."""

    def __init__(self, client: Any, record: Any, before: Any) -> None:
        self._client, self._record, self._before = client, record, before

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._client, method)

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            await self._before(method, args)
            started = time.time()
            try:
                result = await call(*args, **kwargs)
            except Exception as error:
                self._record(event="call", method=method, args=[str(a) for a in args], started=started,
                             ended=time.time(), error=type(error).__name__, cause=getattr(error, "cause", None))
                raise
            self._record(event="call", method=method, args=[str(a) for a in args], started=started,
                         ended=time.time(), error=None, result=str(result) if method == "create_instance" else None)
            return result

        return recorded


class GatedToolLoop:
    def __init__(self, context: LoopContext, gate_dir: str, early: int, mid: int) -> None:
        self.gate = Path(gate_dir)
        self.early, self.mid = early, mid
        self.ended_early, self.waiting_mid = 0, 0
        self.events = (self.gate / "events.jsonl").open("a")
        self.mid_instances: set[str] = set()
        tools = None if context.tools is None else _Recorded(context.tools, self.record, self.before)
        self.context = dataclasses.replace(context, tools=tools)

    def record(self, **event: Any) -> None:
        self.events.write(json.dumps(event) + "\n")
        self.events.flush()
        if event["event"] == "call" and event["method"] == "create_instance" and event["args"][1].startswith("mid"):
            self.mid_instances.add(event["result"])

    def _ready(self) -> None:
        if self.ended_early == self.early and self.waiting_mid == self.mid:
            (self.gate / "ready").write_text(str(time.time()))

    async def _go(self) -> None:
        while not (self.gate / "go").exists():
            await asyncio.sleep(0.01)

    async def before(self, method: str, args: tuple) -> None:
        if method == "execute" and args[0] in self.mid_instances:
            self.waiting_mid += 1
            self._ready()
            await self._go()

    async def run(self, sample: Sample) -> Trajectory:
        if not sample.sample_id.startswith(("early", "mid")):
            await self._go()
        started = time.time()
        parser = _FirstTurnCalls(calls=bool(sample.tools))
        trajectory = await ToolLoop(dataclasses.replace(self.context, parser=parser)).run(sample)
        self.record(event="ended", sample=sample.sample_id, started=started, ended=time.time(),
                    termination=trajectory.termination.value, cause=trajectory.infrastructure_cause)
        if sample.sample_id.startswith("early"):
            self.ended_early += 1
            self._ready()
        return trajectory
