"""Optional dependencies: the error that names the pip extra to install when a part needs a module it lacks.

The base install serves and calls engines, runs the Router, tools and agent loops; engines, trainers and the
report's plots come in extras (pyproject.toml, docs/install.md). A part that needs one imports it inside
``needs_extra``, so a user without it reads which command fixes it instead of a bare ModuleNotFoundError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class MissingExtraError(ModuleNotFoundError):
    """A module of an optional extra is not installed; the message names the extra."""


@contextlib.contextmanager
def needs_extra(what: str, *extras: str) -> Iterator[None]:
    """Turn a ModuleNotFoundError of a third-party module raised inside into a MissingExtraError naming ``extras``
    (any one of them provides it); a missing module of this package is a bug and propagates as it is."""
    if not extras:
        raise ValueError("needs_extra: name at least one extra")
    try:
        yield
    except ModuleNotFoundError as error:
        if isinstance(error, MissingExtraError) or (error.name or "").partition(".")[0] in ("", "agentloop_grpc"):
            raise
        commands = " or ".join(f"`pip install 'agentloop-grpc[{extra}]'`" for extra in extras)
        raise MissingExtraError(f"{what} needs {commands} (module {error.name!r} is not installed)",
                                name=error.name) from error
