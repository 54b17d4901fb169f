"""Jail: a bubblewrap (``bwrap``) command line from a typed spec, and whether bwrap works here.

The one place that knows bwrap's options: the python tool's sessions (``tools/sandbox.py``), per-trajectory MCP
server processes (``tools/mcp_world.py``) and coding agents' workspaces (``harness/workspace.py``) are jailed
through it, and anything else that needs a process with a filesystem and network of its own should be too. The API:

    JailSpec(...).argv(command) -> ["bwrap", ..., "--", *command]    the command, jailed as the spec says
    Tmpfs(path, size_bytes)                                           a private tmpfs in a spec
    Rlimits(...).argv() -> ["prlimit", ..., "--"]                     rlimits, to put before a jail's argv
    probe(spec, command) -> None | "why bwrap cannot run here"        tries the spec for real
    probe_cached() -> the same for a spec using every feature, once per process
    system_paths() -> the /etc files and folders programs commonly read (name lookups, TLS roots, time zone,
                      the loader's cache, Debian's alternatives), those that exist here
    command_paths(argv, search_path) -> the host paths a command needs to read (its program, its interpreter,
                      the venv or node_modules folder its files lie in)

What a jail sees: a root of its own (bwrap's empty tmpfs) on which are mounted, in this order,
  - with ``system`` (default): /usr read-only, and /bin, /sbin, /lib, /lib64 as the host has them (symlinks into
    /usr on a merged-/usr system, read-only binds otherwise);
  - /proc of its own PID namespace and a minimal /dev (null, zero, random, urandom, tty, shm, ...);
  - ``read_only``, ``tmpfs`` and ``writable`` mounts, sorted by the depth of where the jail sees them, so a mount is
    never hidden by one on a folder above it (a writable folder inside a read-only tree, a read-only file inside a
    tmpfs); at one depth, read-only binds first, then tmpfs mounts, then writable binds;
  - ``dirs``: empty folders made there (on a tmpfs, or the root);
  - with ``read_only_root``: the root is made read-only last, so the only writable places are the writable binds
    and the tmpfs mounts.
A bind is a host path seen at the same path (``"/opt/x"``) or elsewhere (``("/host/path", "/in/jail")``); its source
must exist (bwrap refuses to start otherwise: filter with ``os.path.exists`` what may be absent).

Namespaces: all of them are new (user where the kernel allows, PID, IPC, UTS, cgroup, mount, network), so the
jail sees only its own processes and, unless ``network``, has no network but a loopback of its own. Every
capability is dropped (``--cap-drop ALL``): run as root, bwrap would otherwise leave the jail root with every
capability in its user namespace, which suffices to remount a read-only bind read-write and write the host's
files through it (tests/unit/test_jail.py tries). ``die_with_parent``: the jail is killed when the process that
started bwrap dies (its PID namespace with it: nothing it started survives). ``new_session``: a session of its own
(no TIOCSTI into a terminal). ``env``: None keeps the environment bwrap is started with (pass secrets that way:
bwrap's argv is visible to every user of the host); a mapping is the jail's whole environment.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: What programs commonly read under /etc: users and groups, name resolution, TLS roots, the time zone, the dynamic
#: loader's cache and Debian's alternatives (/usr/bin/x -> /etc/alternatives/x -> /usr/...).
SYSTEM_ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf", "localtime",
              "timezone", "ssl", "ca-certificates", "ca-certificates.conf", "pki", "alternatives", "ld.so.cache",
              "ld.so.conf", "ld.so.conf.d", "mime.types")
#: Top-level folders that are part of /usr on a merged-/usr system (symlinks into it) or beside it on others.
_USR_LINKS = ("lib", "lib64", "bin", "sbin")
#: Where a path is already visible in a ``system`` jail: nothing to bind (with ``system_paths()``).
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/proc/", "/dev/")

Bind = str | tuple[str, str]


@dataclass(frozen=True, slots=True)
class Tmpfs:
    """A tmpfs of the jail's own at ``path`` (memory, gone with the jail), at most ``size_bytes`` when given."""

    path: str
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class JailSpec:
    """What a jailed process sees and may do (see the module docstring)."""

    #: Host paths seen read-only: ``"/p"`` at the same path, ``("/host", "/jail")`` elsewhere.
    read_only: tuple[Bind, ...] = ()
    #: Host paths seen writable (same forms).
    writable: tuple[Bind, ...] = ()
    tmpfs: tuple[Tmpfs, ...] = ()
    #: Empty folders made in the jail after the mounts.
    dirs: tuple[str, ...] = ()
    #: /usr and its top-level companions, read-only.
    system: bool = True
    #: The working directory in the jail (default: bwrap's, the host's path if the jail has it, else /).
    chdir: str | None = None
    #: None: the environment bwrap is started with; a mapping: only these variables.
    env: Mapping[str, str] | None = None
    #: Keep the host's network namespace (default: none but a loopback of the jail's own).
    network: bool = False
    die_with_parent: bool = True
    new_session: bool = True
    read_only_root: bool = False

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run in this jail: bwrap's command line."""
        args = [_bwrap()]
        if self.system:
            args += _system_args()
        args += ["--proc", "/proc", "--dev", "/dev"]
        mounts: list[tuple[int, int, list[str]]] = []
        for kind, binds in ((0, self.read_only), (2, self.writable)):
            option = "--ro-bind" if kind == 0 else "--bind"
            for bind in binds:
                source, dest = (bind, bind) if isinstance(bind, str) else bind
                mounts.append((_depth(dest), kind, [option, source, dest]))
        for tmpfs in self.tmpfs:
            size = [] if tmpfs.size_bytes is None else ["--size", str(tmpfs.size_bytes)]
            mounts.append((_depth(tmpfs.path), 1, [*size, "--tmpfs", tmpfs.path]))
        for _, _, mount in sorted(mounts, key=lambda m: (m[0], m[1])):  # stable: given order within a kind
            args += mount
        for folder in self.dirs:
            args += ["--dir", folder]
        if self.read_only_root:
            args += ["--remount-ro", "/"]
        if self.chdir is not None:
            args += ["--chdir", self.chdir]
        # run as root, bwrap keeps every capability in the jail's user namespace, enough to remount a read-only
        # bind read-write and write the host's files through it: drop them all, always
        args += ["--unshare-all", "--cap-drop", "ALL"]
        if self.network:
            args += ["--share-net"]
        if self.die_with_parent:
            args += ["--die-with-parent"]
        if self.new_session:
            args += ["--new-session"]
        if self.env is not None:
            args += ["--clearenv"]
            for key, value in self.env.items():
                args += ["--setenv", key, value]
        return [*args, "--", *command]


@dataclass(frozen=True, slots=True)
class Rlimits:
    """Per-process limits, set by util-linux's prlimit, which then execs the rest of the command line: no Python
    runs between fork and exec (a preexec_fn in a process with gRPC's threads can crash the child). A None is left
    as it is; processes count every process of the uid (RLIMIT_NPROC)."""

    memory_bytes: int | None = None  # address space (RLIMIT_AS)
    cpu_seconds: int | None = None
    processes: int | None = None
    file_bytes: int | None = None
    open_files: int | None = None
    core_bytes: int | None = 0

    def argv(self) -> list[str]:
        limits = (("--as", self.memory_bytes), ("--cpu", self.cpu_seconds), ("--nproc", self.processes),
                  ("--fsize", self.file_bytes), ("--nofile", self.open_files), ("--core", self.core_bytes))
        return ["prlimit", *(f"{option}={value}" for option, value in limits if value is not None), "--"]


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _USR_LINKS:
        top = Path("/", name)
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    return args


def system_paths() -> tuple[str, ...]:
    """The entries of SYSTEM_ETC that exist here, as absolute paths (bind them read-only)."""
    return tuple(str(Path("/etc", name)) for name in SYSTEM_ETC if os.path.exists(Path("/etc", name)))


def _visible(path: str) -> bool:
    """Whether ``path`` is seen in a ``system`` jail that binds ``system_paths()``."""
    return (path + "/").startswith(_SYSTEM_PREFIXES + tuple(p + "/" for p in system_paths()))


def _venv(path: Path) -> Path | None:
    for folder in path.parents:
        if (folder / "pyvenv.cfg").is_file():
            return folder
    return None


def _venv_base(venv: Path) -> Path | None:
    """The Python installation a virtual environment was made from (its pyvenv.cfg's ``home``, less ``bin``)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(value.strip()).resolve()
            return home.parent if home.name == "bin" else home
    return None


def _holder(path: Path) -> list[Path]:
    """What to bind so that ``path`` (absolute, existing) works: its venv and base Python, else its outermost
    node_modules, else the prefix of a program in a ``bin`` folder, the folder of a file, or the folder itself."""
    venv = _venv(path)
    if venv is not None:
        base = _venv_base(venv)
        return [venv] + ([base] if base is not None else [])
    modules = [folder for folder in path.parents if folder.name == "node_modules"]
    if modules:
        return [modules[-1]]
    if path.is_dir():
        return [path]
    return [path.parent.parent if path.parent.name == "bin" else path.parent]


def _interpreter(script: Path, search_path: str | None) -> Path | None:
    """The interpreter of a ``#!`` script (``/usr/bin/env NAME``: NAME as found on ``search_path``)."""
    try:
        with script.open("rb") as file:
            first = file.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0], path=search_path) if names else None
        return Path(found) if found else None
    return Path(words[0])


def command_paths(argv: Sequence[str], search_path: str | None = None) -> tuple[str, ...]:
    """Host paths a command needs to read, beyond what a ``system`` jail sees (/usr, ``system_paths()``): for its
    program and each argument that is an absolute path that exists, as written and with symlinks resolved, the
    virtual environment it lies in and the Python that environment was made from, else the outermost
    ``node_modules`` folder it lies in, else the prefix of a program in a ``bin`` folder, the folder holding a file,
    or the folder itself; for a ``#!`` script, the same for its interpreter (``/usr/bin/env node``: node as found on
    ``search_path``). A program named without a folder is looked up on ``search_path`` first."""
    found: dict[Path, None] = {}
    items = list(argv)
    if items and os.sep not in items[0]:
        items[0] = shutil.which(items[0], path=search_path) or items[0]
    paths = [Path(item) for item in items if item.startswith("/")]
    if items and items[0].startswith("/") and os.path.isfile(items[0]):
        interpreter = _interpreter(Path(items[0]), search_path)  # the program's: a script's arguments run no #!
        if interpreter is not None:
            paths.append(interpreter)
    for path in paths:
        if not path.exists():
            continue
        for candidate in dict.fromkeys((path, path.resolve())):
            for holder in _holder(candidate):
                if not _visible(str(holder)):
                    found[holder] = None
    # a path inside another one found is seen through it
    kept: list[Path] = []
    for path in sorted(found, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return tuple(str(p) for p in kept)


def probe(spec: JailSpec | None = None, command: Sequence[str] = ("/usr/bin/true",),
          timeout_s: float = 30.0) -> str | None:
    """None when ``command`` runs in ``spec``'s jail here (exit 0); otherwise why not, in a sentence."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        result = subprocess.run((spec or JailSpec()).argv(command), capture_output=True, text=True,
                                timeout=timeout_s, env={})
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap failed to start: {error}"
    return None if result.returncode == 0 else f"bwrap cannot create namespaces here: {result.stderr.strip()}"


@functools.cache
def probe_cached() -> str | None:
    """``probe`` of a jail using every feature of a JailSpec (a sized tmpfs, a folder made on it, a read-only
    root, a working directory), once per process: it starts a jail."""
    spec = JailSpec(tmpfs=(Tmpfs("/tmp", 1 << 20),), dirs=("/tmp/probe",), chdir="/tmp/probe", read_only_root=True,
                    env={"PATH": "/usr/bin:/bin"})
    return probe(spec, ("/usr/bin/true",))
