"""The world of one trajectory's MCP server process (an ``mcp:`` entry with a ``command``, not ``shared``).

Every such process, the one started at start-up to list the tools included, gets:
  - a fresh folder, ``{instance_dir}``: its working directory (unless ``cwd`` names another), with HOME at
    ``{instance_dir}/home``, TMPDIR at ``{instance_dir}/tmp``, XDG_CONFIG_HOME, XDG_CACHE_HOME, XDG_DATA_HOME and
    XDG_STATE_HOME under that home and XDG_RUNTIME_DIR at ``{instance_dir}/run``. These override what the MCP SDK
    passes on of the tool server's environment (HOME, LOGNAME, PATH, SHELL, TERM, USER), and ``env`` overrides
    them; ``{instance_dir}``, ``{home}`` and ``{tmpdir}`` in ``command``, ``env`` and ``cwd`` name them
    (``mcp_config.PLACEHOLDERS``);
  - sandboxed (``sandbox: true``, the default, where bwrap works): a jail (``common/jail.py``) in which
    ``{instance_dir}`` is JAILED_DIR, a tmpfs of ``instance_dir_bytes``, /tmp a private tmpfs of ``tmp_bytes``,
    and nothing else writable: the root is read-only and holds only /usr, ``jail.system_paths()``, what the command
    needs (``jail.command_paths``: its program, a script's interpreter, the venv or node_modules its files lie in,
    the folder of each file it names), the ``read_only`` paths and a ``cwd`` outside the folder, all read-only. So
    a file beside the server's own script, in the home folder or at a fixed path cannot be written, by this
    trajectory or any other. Its own PID namespace (the pids it sees are not the host's), no network but a
    loopback of its own unless ``network``; killed with the tool server (bwrap's die-with-parent). Nothing of it is
    on the host's disk: its folder goes with its process;
  - unsandboxed (``sandbox: false``, or where bwrap cannot run, which the server logs loudly): its folder is a host
    folder (mode 0700, ``agentloop-mcp-<name>-*`` in the tool server's temporary folder), removed when its session
    closes, and the process may write wherever the tool server's user can, so what it keeps beside its script, at
    a fixed path or in /tmp is shared by every trajectory.

Paths in ``command`` keep the meaning they had before the process moved into its folder: a program or argument
that names an existing file (or, written with a ``/``, a folder) relative to ``cwd`` when it is given, else to the
tool server's working directory, is made absolute; a program named without a folder is looked up on PATH (the
``env``'s, else the tool server's), then beside the tool server's Python.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentloop_grpc.common.jail import JailSpec, Tmpfs, command_paths, system_paths

from .errors import ToolBackendError
from .mcp_config import McpServerEntry, expand

#: Where a sandboxed process sees its folder.
JAILED_DIR = "/instance"


def program(name: str, search_path: str | None = None) -> str:
    """``name`` as the command to start: a bare name not on PATH is looked up beside this Python too, so an MCP
    server installed in the tool server's virtual environment starts without that environment on PATH."""
    if os.sep in name:
        return name
    found = shutil.which(name, path=search_path)
    if found is not None:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


def world_env(directory: str) -> dict[str, str]:
    """The variables that put a process's home, temporary and XDG folders in ``directory``."""
    home = f"{directory}/home"
    return {"HOME": home, "TMPDIR": f"{directory}/tmp", "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state", "XDG_RUNTIME_DIR": f"{directory}/run"}


def _folders(directory: str) -> list[str]:
    env = world_env(directory)
    return [env["HOME"], *(env[k] for k in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
                                             "XDG_STATE_HOME")), env["TMPDIR"], env["XDG_RUNTIME_DIR"]]


@dataclass
class World:
    """One process's world: what to start (``argv``, ``env`` over the SDK's defaults, ``cwd`` on the host) and
    what to remove once it stopped."""

    directory: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    jailed: bool
    host_folder: Path | None = None
    _removed: bool = field(default=False, repr=False)

    def remove(self) -> None:
        """Remove the host folder (a jailed world has none: its tmpfs went with its process). Call it once the
        process stopped; a straggler still writing is outlasted by a few tries."""
        if self._removed or self.host_folder is None:
            return
        for _ in range(5):
            shutil.rmtree(self.host_folder, ignore_errors=True)
            if not self.host_folder.exists():
                break
            time.sleep(0.1)
        self._removed = True


def _absolute(word: str, base: Path) -> str:
    """``word`` made absolute against ``base`` when it names an existing file there (or a folder, when written
    with a ``/``); else as it is."""
    if word.startswith(("/", "-")) or not word:
        return word
    candidate = base / word
    if candidate.is_file() or (os.sep in word and candidate.exists()):
        return str(candidate.resolve())
    return word


def make_world(entry: McpServerEntry, jailed: bool) -> World:
    """A world for one process of ``entry`` (see the module docstring); ToolBackendError
    (``mcp_server_not_started``) when its program, a ``read_only`` path or its ``cwd`` does not exist."""
    assert entry.command is not None and not entry.shared
    label = f"MCP server {entry.name!r} could not be started"
    host_folder = None
    if jailed:
        directory = JAILED_DIR
    else:
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", entry.name)[:40]
        host_folder = Path(tempfile.mkdtemp(prefix=f"agentloop-mcp-{slug}-"))
        directory = str(host_folder)
    try:
        return _populate(entry, jailed, directory, host_folder, label)
    except BaseException:
        if host_folder is not None:
            shutil.rmtree(host_folder, ignore_errors=True)
        raise


def _populate(entry: McpServerEntry, jailed: bool, directory: str, host_folder: Path | None, label: str) -> World:
    assert entry.command is not None
    values = {"instance_dir": directory, "home": f"{directory}/home", "tmpdir": f"{directory}/tmp"}
    env = {**world_env(directory), **{key: expand(value, values) for key, value in entry.env.items()}}
    search_path = env.get("PATH", os.environ.get("PATH"))
    cwd = directory
    if entry.cwd is not None:
        cwd = expand(entry.cwd, values)
        cwd = cwd if cwd.startswith("/") else str(Path.cwd() / cwd)
    inside = cwd == directory or cwd.startswith(directory + "/")
    base = Path(cwd) if entry.cwd is not None and not inside else Path.cwd()
    argv = [_absolute(expand(word, values), base) for word in entry.command]
    argv[0] = program(argv[0], search_path)
    if not os.path.isfile(argv[0]):
        raise ToolBackendError("mcp_server_not_started", f"{label}: its program {argv[0]!r} is not a file (nor "
                               "found on PATH or beside the tool server's Python)")
    folders = _folders(directory) + ([cwd] if inside and cwd != directory else [])
    if not jailed:
        for folder in folders:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        return World(directory, argv, env, cwd, False, host_folder)
    read_only = [*system_paths(), *command_paths(argv, search_path)]
    for path in [*entry.read_only, *([] if inside else [cwd])]:
        if not os.path.exists(path):
            raise ToolBackendError("mcp_server_not_started", f"{label}: {path!r} (read_only or cwd) does not exist")
        read_only.append(path)
    spec = JailSpec(
        read_only=tuple(dict.fromkeys(read_only)),
        tmpfs=(Tmpfs("/tmp", entry.tmp_bytes), Tmpfs(directory, entry.instance_dir_bytes)),
        dirs=tuple(folders),
        chdir=cwd,
        network=entry.network,
        read_only_root=True,
    )
    return World(directory, spec.argv(argv), env, "/", True)


def unsandboxed_warning(entry: McpServerEntry, why: str) -> str:
    """What the server logs, loudly, for a per-trajectory server that runs unsandboxed."""
    return (f"MCP SERVER {entry.name!r} IS NOT SANDBOXED ({why}). Each trajectory's process still gets a folder "
            "of its own as working directory, HOME, TMPDIR and XDG folders, but may write wherever this server's "
            "user can: what it keeps beside its script, at a fixed path, in the real home or in /tmp is shared "
            "by every trajectory (and outlives the run).")


def sandbox_hint(entry: McpServerEntry) -> str:
    """Appended to a sandboxed server's start-up failure."""
    return (f" (it runs sandboxed: it sees /usr, system files of /etc, what its command names and its read_only "
            f"paths, read-only, and writes only its folder and /tmp{'' if entry.network else ', with no network'}; "
            "its stderr is in the tool server's log; `read_only` adds paths, `network: true` the network, "
            "`sandbox: false` turns the sandbox off)")
