"""What clients and servers agree on about tokens: the metadata key, which calls are control calls, and where a
config says a secret is (a file or an environment variable, never the secret itself, so configs can be written to
discovery files, YAML and logs)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

#: The metadata key of the bearer token (lower case, as HTTP/2 requires).
AUTHORIZATION = "authorization"

#: RPCs that change what a server does for every caller: they need the admin token where one is configured.
CONTROL_METHODS = frozenset(
    f"/agentloop.v1.EngineControl/{name}"
    for name in (
        "Sleep", "WakeUp", "Pause", "Resume", "UpdateWeights", "LoadWeights", "JoinWeightGroup", "ReceiveWeights",
        "LeaveWeightGroup", "FlushCache",
    )
)
#: Abort is a control call only when it aborts every request (``AbortRequest.all``).
ABORT_METHOD = "/agentloop.v1.TokenGenerate/Abort"


def read_secret(file: str | None, env: str | None, what: str) -> str | None:
    """The secret in ``file`` or in environment variable ``env``, stripped of surrounding white space (a file's
    trailing newline included); None when neither is given."""
    if file is not None and env is not None:
        raise ValueError(f"{what}: give a file or an environment variable, not both")
    if file is not None:
        value = Path(file).read_text().strip()
        if not value:
            raise ValueError(f"{what}: the file {file} is empty")
        return value
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ValueError(f"{what}: the environment variable {env} is not set")
        return value
    return None


def is_control_call(method: str, request: object | None) -> bool:
    """Whether ``method`` (``/package.Service/Method``) with ``request`` is a control call."""
    return method in CONTROL_METHODS or (method == ABORT_METHOD and bool(getattr(request, "all", False)))


class TokenSources(BaseModel):
    """Where the user token and the admin token are: a file or an environment variable each, both optional. A
    client sends the user token with every call and the admin token with control calls; a server requires them."""

    token_file: str | None = Field(None, description="File holding the bearer token of every call but health.")
    token_env: str | None = Field(None, description="Environment variable holding that token.")
    admin_token_file: str | None = Field(
        None, description="File holding the admin token of control calls (accepted for every call)."
    )
    admin_token_env: str | None = Field(None, description="Environment variable holding the admin token.")

    @model_validator(mode="after")
    def _one_source_each(self) -> TokenSources:
        if self.token_file is not None and self.token_env is not None:
            raise ValueError("security: give token_file or token_env, not both")
        if self.admin_token_file is not None and self.admin_token_env is not None:
            raise ValueError("security: give admin_token_file or admin_token_env, not both")
        return self

    @property
    def has_token(self) -> bool:
        return any((self.token_file, self.token_env, self.admin_token_file, self.admin_token_env))

    def tokens(self) -> tuple[str | None, str | None]:
        """(user token, admin token) as read now; a missing file or variable is a ValueError."""
        return (read_secret(self.token_file, self.token_env, "token"),
                read_secret(self.admin_token_file, self.admin_token_env, "admin token"))
