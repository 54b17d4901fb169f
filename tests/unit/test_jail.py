"""common/jail.py: the bwrap command line a JailSpec makes (mount order, namespaces, environment), what such a jail
lets a process do when run for real (each property tried), rlimits, what a command needs bound, and the probe."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentloop_grpc.common import jail
from agentloop_grpc.common.jail import JailSpec, Rlimits, Tmpfs, command_paths, probe, probe_cached, system_paths

ROOT = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(probe_cached() is not None, reason=f"no bwrap here: {probe_cached()}")


def options(argv: list[str]) -> list[str]:
    """The argv less bwrap's path and the system mounts (the same in every spec with ``system``)."""
    start = argv.index("--proc")
    return argv[start:]


def test_mounts_go_shallow_to_deep_and_read_only_then_tmpfs_then_writable_at_one_depth() -> None:
    spec = JailSpec(read_only=("/opt/tree", ("/srv/data", "/data")), writable=("/opt/tree/out", "/w"),
                    tmpfs=(Tmpfs("/tmp", 1024), Tmpfs("/opt")), dirs=("/tmp/a",), chdir="/w",
                    read_only_root=True)
    assert options(spec.argv(["prog", "--flag"])) == [
        "--proc", "/proc", "--dev", "/dev",
        "--ro-bind", "/srv/data", "/data", "--size", "1024", "--tmpfs", "/tmp", "--tmpfs", "/opt", "--bind", "/w",
        "/w", "--ro-bind", "/opt/tree", "/opt/tree", "--bind", "/opt/tree/out", "/opt/tree/out",
        "--dir", "/tmp/a", "--remount-ro", "/", "--chdir", "/w",
        "--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--", "prog", "--flag"]


def test_namespaces_session_and_environment() -> None:
    spec = JailSpec(system=False, network=True, die_with_parent=False, new_session=False,
                    env={"HOME": "/w", "PATH": "/usr/bin"})
    assert spec.argv(["x"])[1:] == ["--proc", "/proc", "--dev", "/dev", "--unshare-all", "--cap-drop", "ALL",
                                    "--share-net", "--clearenv", "--setenv", "HOME", "/w", "--setenv", "PATH",
                                    "/usr/bin", "--", "x"]


def test_system_mounts_follow_the_host() -> None:
    argv = JailSpec().argv(["x"])
    assert argv[1:4] == ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "bin", "sbin"):
        top = Path("/", name)
        if top.is_symlink():
            at = argv.index(str(top))
            assert argv[at - 2:at + 1] == ["--symlink", str(top.readlink()), str(top)]


def test_rlimits_as_prlimit_options() -> None:
    assert Rlimits(memory_bytes=1 << 29, cpu_seconds=60, processes=16, file_bytes=1 << 24, open_files=64).argv() == [
        "prlimit", f"--as={1 << 29}", "--cpu=60", "--nproc=16", f"--fsize={1 << 24}", "--nofile=64", "--core=0", "--"]
    assert Rlimits(core_bytes=None).argv() == ["prlimit", "--"]


def test_what_a_command_needs_bound(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    base = Path(sys.base_prefix).resolve()
    found = command_paths([sys.executable, "-c", "pass"])
    assert str(venv) in found and (str(base) in found or str(base).startswith("/usr"))
    assert command_paths(["/usr/bin/env", "true"]) == ()  # /usr is seen already
    script = tmp_path / "tools" / "server.py"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python3\n")
    assert command_paths(["/usr/bin/python3", str(script), "--port", "1"]) == (str(script.parent),)
    package = tmp_path / "app" / "node_modules" / "@scope" / "server" / "dist"
    package.mkdir(parents=True)
    (package / "index.js").write_text("#!/usr/bin/env node\n")
    link = tmp_path / "app" / "node_modules" / ".bin" / "server"
    link.parent.mkdir()
    link.symlink_to(package / "index.js")
    assert command_paths([str(link)]) == (str(tmp_path / "app" / "node_modules"),)
    prefix = tmp_path / "opt" / "lang"  # an interpreter in a prefix of its own, named by a script's #!
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "lang").write_text("")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "run.lang").write_text(f"#!{prefix}/bin/lang -x\n")
    assert set(command_paths([str(scripts / "run.lang")])) == {str(scripts), str(prefix)}
    assert command_paths([str(scripts / "run.lang"), str(scripts)]) == (str(scripts), str(prefix))
    assert command_paths([str(tmp_path / "scripts" / "run.lang"), str(tmp_path)]) == (str(tmp_path),)  # one holds all
    assert command_paths(["absent-program-xyz", "/no/such/file"]) == ()


def test_the_probe_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jail.shutil, "which", lambda name, path=None: None)
    assert probe() == "bubblewrap (bwrap) is not installed"


def run(spec: JailSpec, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(spec.argv(["/bin/sh", "-c", script]), capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FROM_HOST": "yes"})


@needs_bwrap
@pytest.mark.fault
def test_only_writable_binds_and_tmpfs_can_be_written(tmp_path: Path) -> None:
    shown, out, hidden = tmp_path / "shown", tmp_path / "out", tmp_path / "hidden"
    for folder in (shown, out, hidden):
        folder.mkdir()
    (shown / "f").write_text("visible")
    spec = JailSpec(read_only=(*system_paths(), str(shown)), writable=(str(out),), tmpfs=(Tmpfs("/tmp", 1 << 20),),
                    dirs=("/tmp/made",), chdir="/tmp/made", read_only_root=True)
    result = run(spec, f"""
        cat {shown}/f; echo
        echo x > {shown}/g 2>/dev/null || echo shown-refused
        echo x > {out}/g && echo out-written
        ls {hidden} 2>/dev/null || echo hidden-absent
        echo x > /new 2>/dev/null || echo root-refused
        echo x > /etc/passwd 2>/dev/null || echo etc-refused
        pwd
        head -c 2000000 /dev/zero > /tmp/big 2>/dev/null || echo tmp-full
    """)
    assert result.stdout.split() == ["visible", "shown-refused", "out-written", "hidden-absent", "root-refused",
                                     "etc-refused", "/tmp/made", "tmp-full"], result.stderr
    assert (out / "g").read_text() == "x\n" and not (shown / "g").exists()


@needs_bwrap
@pytest.mark.fault
def test_no_capability_to_remount_a_read_only_bind(tmp_path: Path) -> None:
    """The escape tried: run as root, bwrap left the jail every capability of its user namespace, and
    ``mount -o remount,rw,bind`` made a read-only bind writable, through which the host's file was written."""
    shown = tmp_path / "shown"
    shown.mkdir()
    spec = JailSpec(read_only=(str(shown),), read_only_root=True)
    result = run(spec, f"grep CapEff /proc/self/status; mount -o remount,rw,bind {shown} 2>/dev/null && "
                       f"echo remounted; mount -o remount,rw / 2>/dev/null && echo root-remounted; "
                       f"touch {shown}/escaped 2>/dev/null || echo refused")
    assert result.stdout.split() == ["CapEff:", "0000000000000000", "refused"], result.stderr
    assert not (shown / "escaped").exists()


@needs_bwrap
def test_no_network_unless_asked_and_its_own_processes() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else None
    if python is None:
        pytest.skip("no system python3 to connect with")
    connect = (f"{python} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\""
               " 2>/dev/null || echo unreachable")
    try:
        assert run(JailSpec(), connect).stdout.split() == ["unreachable"]
        assert run(JailSpec(network=True), connect).stdout.split() == ["reached"]
    finally:
        listener.close()
    assert run(JailSpec(), "echo $$; ls /proc | grep -c '^[0-9]'").stdout.split()[0] in ("1", "2")


@needs_bwrap
def test_the_environment_is_bwraps_or_only_the_given_one() -> None:
    assert run(JailSpec(), "echo ${FROM_HOST:-unset}").stdout.strip() == "yes"
    assert run(JailSpec(env={"ONLY": "this", "PATH": "/usr/bin"}), "echo ${FROM_HOST:-unset} $ONLY").stdout.split() \
        == ["unset", "this"]


def test_bwrap_is_named_by_its_path_when_installed() -> None:
    assert JailSpec().argv(["x"])[0] == (shutil.which("bwrap") or "bwrap")


def test_a_repository_script_is_bound_by_its_folder() -> None:
    server = ROOT / "tests" / "tools" / "mcp_test_server.py"
    assert str(server.parent) in command_paths([sys.executable, str(server)])
