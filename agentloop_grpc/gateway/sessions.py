"""Sessions: what the gateway keeps per agent run, and the table that bounds and expires them.

A session is one sample of a dataset as an external agent plays it: its metadata (sample id, GRPO group, the
dataset row and its ground truth), its chains (one trajectory each: a history that does not append forks a new
one, and why is recorded), and its reward. The table holds at most ``max_sessions`` and drops a session untouched
for ``session_ttl_s`` (counted), so an agent that never finishes its session leaks nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .chain import Chain
from .config import ForcedSampling, GatewayLimits
from .exchange import GatewayError

#: Names of ignored fields one session keeps (a hostile client could send endless new ones).
MAX_IGNORED_PER_SESSION = 256
#: A session id: letters, digits and ``._:-``, as it appears in a URL path (whole: fullmatch, so no final newline).
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
#: Ids that read as paths (``.`` and ``..``), refused though they fit the pattern.
PATH_LIKE_SESSION_IDS = frozenset({".", ".."})
#: The error a session id that is not one gets, in the route and in POST /sessions alike.
BAD_SESSION_ID = "the session id must be 1-128 letters, digits or ._:-, and not . or .."


def is_session_id(session_id: str) -> bool:
    """The one check of a session id, for the URL path and POST /sessions alike."""
    return SESSION_ID_PATTERN.fullmatch(session_id) is not None and session_id not in PATH_LIKE_SESSION_IDS


class SessionSpec(BaseModel):
    """What a session is created with (POST /sessions); every field optional."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str | None = Field(None, description="None: the gateway makes one.")
    sample_id: str | None = Field(None, max_length=256, description="The trajectory's sample id (None: the "
                                  "session id); forks add /fork-N.")
    group_id: str = Field("", max_length=256, description="The GRPO group: sessions of one prompt share it.")
    ground_truth: str | None = Field(None, max_length=65536, description="What the reward function compares with.")
    row: dict[str, Any] = Field(default_factory=dict, description="The dataset row, kept with the session.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Anything else, kept with the session.")
    sampling: ForcedSampling | None = Field(None, description="This session's forced sampling, over the gateway's "
                                            "(e.g. greedy for a validation sample); None: the gateway's.")

    @field_validator("session_id")
    @classmethod
    def _session_id(cls, session_id: str | None) -> str | None:
        if session_id is not None and not is_session_id(session_id):
            raise ValueError(BAD_SESSION_ID)
        return session_id


@dataclass(frozen=True, slots=True)
class Fork:
    """A chain started because a request did not append to the session's chains."""

    chain: int
    reason: str


@dataclass(slots=True)
class Session:
    id: str
    spec: SessionSpec
    chains: list[Chain] = field(default_factory=list)
    forks: list[Fork] = field(default_factory=list)
    reward: float | None = None
    reward_metrics: dict[str, float] = field(default_factory=dict)
    in_flight: int = 0
    next_chain: int = 0
    created: float = field(default_factory=time.time)
    touched: float = field(default_factory=time.monotonic)
    #: What its requests held that the gateway accepted and ignored, by name: how many requests held it.
    ignored: dict[str, int] = field(default_factory=dict)

    def note_ignored(self, names: tuple[str, ...]) -> None:
        for name in names:
            if name in self.ignored or len(self.ignored) < MAX_IGNORED_PER_SESSION:
                self.ignored[name] = self.ignored.get(name, 0) + 1

    @property
    def sample_id(self) -> str:
        return self.spec.sample_id or self.id

    def chain_sample_id(self, index: int) -> str:
        return self.sample_id if index == 0 else f"{self.sample_id}/fork-{index}"

    def summary(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "sample_id": self.sample_id,
            "group_id": self.spec.group_id,
            "chains": len(self.chains),
            "turns": sum(c.builder.assistant_turns for c in self.chains),
            "forks": [{"chain": f.chain, "reason": f.reason} for f in self.forks],
            "reward": self.reward,
            "ignored": dict(self.ignored),
            "in_flight": self.in_flight,
            "created": self.created,
            "metadata": dict(self.spec.metadata),
        }


class SessionTable:
    def __init__(self, limits: GatewayLimits) -> None:
        self.limits = limits
        self._sessions: dict[str, Session] = {}
        self.expired = 0
        self._swept = time.monotonic()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, spec: SessionSpec) -> Session:
        session_id = spec.session_id or uuid.uuid4().hex
        if session_id in self._sessions:
            raise GatewayError(f"session {session_id} exists already", status=409, kind="conflict",
                               param="session_id")
        return self._add(Session(session_id, spec))

    def get(self, session_id: str, create: bool = False) -> Session:
        """The session (touched); ``create``: a session used before it was created starts empty."""
        self.sweep()
        session = self._sessions.get(session_id)
        if session is None:
            if not create:
                raise GatewayError(f"no session {session_id} (finished, expired or never created)", status=404,
                                   kind="not_found", param="session_id")
            session = self._add(Session(session_id, SessionSpec(session_id=session_id)))
        session.touched = time.monotonic()
        return session

    def pop(self, session_id: str) -> Session:
        session = self.get(session_id)
        if session.in_flight:
            raise GatewayError(f"session {session_id} has {session.in_flight} requests in flight; finish it once "
                               "they are answered", status=409, kind="conflict", param="session_id")
        return self._sessions.pop(session_id)

    def all(self) -> list[Session]:
        self.sweep()
        return list(self._sessions.values())

    def sweep(self, now: float | None = None) -> int:
        """Drop sessions idle past the TTL (at most once a second unless ``now`` is given); how many."""
        now = time.monotonic() if now is None else now
        if now - self._swept < 1.0 and now >= self._swept:
            return 0
        self._swept = now
        ttl = self.limits.session_ttl_s
        stale = [s.id for s in self._sessions.values() if not s.in_flight and now - s.touched > ttl]
        for session_id in stale:
            del self._sessions[session_id]
        self.expired += len(stale)
        return len(stale)

    def _add(self, session: Session) -> Session:
        if len(self._sessions) >= self.limits.max_sessions:
            self.sweep(time.monotonic())
        if len(self._sessions) >= self.limits.max_sessions:
            raise GatewayError(f"the gateway holds max_sessions={self.limits.max_sessions} sessions; finish some",
                               status=429, kind="rate_limit", param="session_id")
        self._sessions[session.id] = session
        return session
