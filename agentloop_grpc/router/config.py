"""RouterConfig: every knob of routing, health, failover and deadlines, with bounds and the reason for each."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from agentloop_grpc.client_security import ClientSecurity


class Placement(enum.StrEnum):
    """How the Router places requests (policy.py says each rule)."""

    CACHE_AWARE = "cache_aware"
    STICKY_LEAST_LOADED = "sticky_least_loaded"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    CONSISTENT_HASH = "consistent_hash"


class RouterConfig(BaseModel):
    """How the Router spreads sessions over engine servers and recovers from failures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_sessions: int = Field(100_000, ge=1, description="Sessions remembered for affinity (LRU beyond this).")
    session_ttl_s: float = Field(
        3600.0, gt=0, description="A session idle this long is forgotten (its next request is placed anew); ended "
        "trajectories and gateway sessions are forgotten at once.")
    placement: Placement = Field(
        Placement.CACHE_AWARE,
        description="cache_aware: a session stays on its server (prefix cache) within the imbalance bound; a new "
        "one goes to a server holding its GRPO group, else the one holding most of its prompt, else the least "
        "loaded, avoiding servers under KV pressure. sticky_least_loaded: the same without group, prefix or "
        "pressure. consistent_hash: by a hash of the session id (reproducible across runs; sessions still fail "
        "over). least_loaded and round_robin: per request, no stickiness (benchmark anchors).",
    )
    kv_pressure_usage: float = Field(
        0.95, gt=0, le=1, description="A server whose KV cache is this full (GetLoad.kv_cache_usage), or whose "
        "preemption count rose within the last load_poll_interval_s, takes no new session while another server can "
        "(cache_aware); its own sessions go on."
    )
    pressure_wait_s: float = Field(
        2.0, ge=0, description="While every server is under KV pressure, how long a new session waits for one to "
        "recover before it is placed anyway (cache_aware): queueing into a thrashing engine costs more."
    )
    prefix_index_blocks: int = Field(
        200_000, ge=0, description="Prompt blocks the Router remembers having sent to each server, over all "
        "servers (LRU), to place a new session where its prompt's prefix is cached (cache_aware); 0: off."
    )
    prefix_tokens_per_load: int = Field(
        512, ge=1, description="What a cached prefix is worth in queue (cache_aware): a server holding more of a new "
        "session's prompt than the least-loaded server draws the session while its load exceeds the lowest by at "
        "most one request per this many tokens it holds beyond that server's. A system prompt every server holds "
        "weighs nothing then; a long shared history much."
    )
    prefix_block_tokens: int = Field(
        64, ge=1, le=4096, description="Tokens per block of that record (the first 64 blocks of a prompt count)."
    )
    imbalance_ratio: float = Field(
        2.0,
        ge=1.0,
        description="A session leaves its server when that server's load exceeds this multiple of the least "
        "loaded server's load (and the gap exceeds imbalance_min_gap).",
    )
    imbalance_min_gap: int = Field(
        8,
        ge=0,
        description="Never move a session when its server has at most this many more requests than the least "
        "loaded one: a cache miss costs more than a small queue.",
    )
    load_poll_interval_s: float = Field(
        0.5, gt=0, description="How often each server's load refines the locally tracked in-flight counts: a "
        "GetLoad poll of every server carrying requests of this Router that reported none on a completed generation "
        "within this interval (the others: idle_load_poll_interval_s)."
    )
    idle_load_poll_interval_s: float = Field(
        2.0, gt=0, description="How often a server carrying none of this Router's requests is polled (at least "
        "load_poll_interval_s), unless a completion reported its load meanwhile: only its liveness and other "
        "clients' load are at stake there, and W Routers over S servers would otherwise each send S polls every "
        "load_poll_interval_s."
    )
    discovery_poll_s: float = Field(
        1.0, ge=0, le=3600, description="A Router or Fleet built from a launcher's discovery file re-reads it this "
        "often while running: servers the file gains (a lost one restarted elsewhere) are added, those it drops are "
        "removed once they stop answering. 0: the file is read once."
    )
    health_retry_interval_s: float = Field(
        0.5, gt=0, description="Delay before re-watching the health of a server whose watch stream failed."
    )
    liveness_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A healthy server whose GetLoad polls go unanswered this long (a wedged event loop, a stopped "
        "process) is taken out of routing, and its in-flight generations fail over and resume elsewhere from "
        "the tokens received; it is routed to again once its health watch says SERVING. Apart from this, each "
        "channel pings its server when no data arrives and closes a connection whose ping goes unanswered (a "
        "stopped process, a network partition), which fails its calls over the same way.",
    )
    generate_timeout_s: float = Field(600.0, gt=0, description="Default deadline of a whole generate call.")
    control_timeout_s: float = Field(120.0, gt=0, description="Deadline of each control call (sleep, pause, ...).")
    max_attempts: int = Field(
        5, ge=1, description="Attempts of one generate across servers (first try included) on UNAVAILABLE."
    )
    backoff_initial_s: float = Field(0.05, gt=0, description="First retry delay; doubles each retry.")
    backoff_max_s: float = Field(2.0, gt=0, description="Upper bound of the retry delay.")
    no_server_wait_s: float = Field(
        10.0, ge=0, description="How long a generate waits for some server to become healthy before failing."
    )
    max_streams_per_server: int = Field(
        512, ge=1, description="Generate calls (streams or unary) open at once on one server's channel; more "
        "callers wait for a slot (gRPC cancels streams when one channel carries too many at once)."
    )
    generate_chunk_tokens: int = Field(
        32,
        ge=0,
        description="generate() (the whole result at once) asks servers to send tokens in messages of at least "
        "this many (StreamOptions.min_chunk_tokens): short generations then cost one message, not one per token. "
        "A failover resumes from the last received message, so tokens pending on a dead server are generated "
        "again. 0 or 1: every token as decoded. stream() sends every token unless told otherwise.",
    )
    unary_generate: bool = Field(
        True,
        description="generate() sends a request whose max_new_tokens is at most generate_chunk_tokens as one "
        "unary GenerateUnary call instead of a stream: its grouped stream would carry every token in the final "
        "message anyway, and a unary call costs both ends less CPU. False: always stream (e.g. for a server that "
        "implements only Generate).",
    )
    weight_chunk_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="UpdateWeights splits tensors into messages of at most this size."
    )
    security: ClientSecurity | None = Field(
        None, description="TLS and tokens for servers that require them (default: plaintext, no token; "
        "Router.from_discovery_file takes the discovery file's when this is unset)."
    )
