"""What the contract suite needs to know about one engine server, and helpers to read Generate streams.

Every adapter joins the suite by providing a ContractTarget (see conftest.py): a running server on loopback plus
a few engine-specific values (a valid prompt, lengths that keep a request busy long enough to act on it
mid-stream, a tensor that UpdateWeights accepts). Tests talk to the server only through the contract.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentloop_grpc.v1 import engine_pb2, engine_pb2_grpc, generation_pb2, generation_pb2_grpc


@dataclass
class ContractTarget:
    """A running engine server under test."""

    name: str
    address: str
    channel: grpc.aio.Channel
    prompt: list[int]
    #: max_new_tokens for a request that stays in flight for at least about a second.
    long_tokens: int
    #: A tensor UpdateWeights accepts (a real parameter for real engines).
    sample_tensor: engine_pb2.TensorChunk
    #: The ids of one image's span in a prompt: the model's expansion of any picture (empty: it takes none).
    image_tokens: tuple[int, ...] = ()
    generate: generation_pb2_grpc.TokenGenerateAsyncStub = field(init=False)
    control: engine_pb2_grpc.EngineControlAsyncStub = field(init=False)
    health: health_pb2_grpc.HealthStub = field(init=False)

    def __post_init__(self) -> None:
        self.generate = generation_pb2_grpc.TokenGenerateStub(self.channel)
        self.control = engine_pb2_grpc.EngineControlStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def info(self) -> engine_pb2.GetServerInfoResponse:
        return await self.control.GetServerInfo(engine_pb2.GetServerInfoRequest(), timeout=10)

    async def load(self) -> generation_pb2.GetLoadResponse:
        return await self.generate.GetLoad(generation_pb2.GetLoadRequest(), timeout=10)

    async def health_status(self, service: str = "") -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self.health.Check(request, timeout=10)  # type: ignore[attr-defined]  # typeshed's HealthStub declares no methods
        return response.status

    async def reset(self) -> None:
        """Back to a clean state between tests: resumed, awake, nothing in flight."""
        await self.control.Resume(engine_pb2.ResumeRequest(), timeout=30)
        await self.control.WakeUp(engine_pb2.WakeUpRequest(), timeout=60)
        await self.generate.Abort(generation_pb2.AbortRequest(all=True), timeout=10)
        await self.wait_no_requests()

    async def wait_running(self, timeout_s: float = 60) -> None:
        """Wait until the engine runs at least one request."""
        async with asyncio.timeout(timeout_s):
            while not (await self.load()).running_requests:
                await asyncio.sleep(0.01)

    async def reload_same_weights(self) -> None:
        """Pause(KEEP) -> UpdateWeights with ``sample_tensor`` at its current value -> Resume: the weight version
        goes up by one and no output changes (in-flight requests keep their place)."""
        await self.control.Pause(engine_pb2.PauseRequest(mode=engine_pb2.PAUSE_MODE_KEEP), timeout=30)
        commit = engine_pb2.UpdateWeightsRequest(commit=engine_pb2.UpdateWeightsCommit(flush_cache=False))

        async def update():
            for message in (engine_pb2.UpdateWeightsRequest(tensor=self.sample_tensor), commit):
                yield message

        await self.control.UpdateWeights(update(), timeout=120)
        await self.control.Resume(engine_pb2.ResumeRequest(), timeout=30)

    async def wait_no_requests(self, timeout_s: float = 10.0) -> generation_pb2.GetLoadResponse:
        """Poll GetLoad until nothing runs or waits; return the last load (tests assert on it)."""
        deadline = time.monotonic() + timeout_s
        load = await self.load()
        while (load.running_requests or load.waiting_requests) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            load = await self.load()
        return load


_ids = iter(range(1, 1 << 62))


def request(
    target: ContractTarget, request_id: str | None = None, prompt: list[int] | None = None, **sampling
) -> generation_pb2.GenerateRequest:
    """A GenerateRequest with a fresh id and the given sampling fields."""
    return generation_pb2.GenerateRequest(
        request_id=f"{target.name}-req-{next(_ids)}" if request_id is None else request_id,
        session_id="contract",
        prompt_ids=target.prompt if prompt is None else prompt,
        sampling_params=generation_pb2.SamplingParams(**sampling),
    )


@dataclass
class Collected:
    """A whole Generate stream."""

    messages: list[generation_pb2.GenerateResponse]

    @property
    def chunks(self) -> list[generation_pb2.TokenChunk]:
        return [m.chunk for m in self.messages if m.WhichOneof("response") == "chunk"]

    @property
    def complete(self) -> generation_pb2.GenerateComplete:
        return self.messages[-1].complete

    @property
    def tokens(self) -> list[int]:
        """Every generated token: the chunks', then those sent with the completion (StreamOptions)."""
        return [t for c in self.chunks for t in c.token_ids] + list(self.complete.tokens.token_ids)

    @property
    def logprobs(self) -> list[float]:
        return [lp for c in self.chunks for lp in c.logprobs] + list(self.complete.tokens.logprobs)


async def collect(target: ContractTarget, req: generation_pb2.GenerateRequest, deadline_s: float = 120) -> Collected:
    messages = [m async for m in target.generate.Generate(req, timeout=deadline_s)]
    return Collected(messages)


async def generate_error(target: ContractTarget, req: generation_pb2.GenerateRequest) -> grpc.aio.AioRpcError:
    """Run a Generate that must fail; return its error."""
    try:
        async for _ in target.generate.Generate(req, timeout=30):
            pass
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("Generate succeeded but an error status was expected")


async def read_rest(call: grpc.aio.UnaryStreamCall) -> list[generation_pb2.GenerateResponse]:
    """Read a stream to its end with ``read()`` (grpc forbids mixing read() with async iteration on one call)."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        assert isinstance(message, generation_pb2.GenerateResponse)
        messages.append(message)
    return messages


class StreamWatcher:
    """Reads a Generate stream in the background so a test can look at what has arrived so far.

    (Cancelling a pending ``read()`` cancels the whole RPC, so a test must never time out a read itself.)
    """

    def __init__(self, target: ContractTarget, req: generation_pb2.GenerateRequest, timeout: float = 120) -> None:
        self.call = target.generate.Generate(req, timeout=timeout)
        self.messages: list[generation_pb2.GenerateResponse] = []
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> Collected:
        async for message in self.call:
            self.messages.append(message)
        return Collected(self.messages)

    @property
    def token_count(self) -> int:
        return sum(len(m.chunk.token_ids) for m in self.messages)

    async def first_tokens(self, timeout_s: float = 60) -> None:
        """Wait until at least one token arrived."""
        async with asyncio.timeout(timeout_s):
            while not self.token_count:
                await asyncio.sleep(0.005)

    async def result(self) -> Collected:
        return await self._task
