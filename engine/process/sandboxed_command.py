"""A command that is not a hook but runs what a plugin ships (its dependencies' build and install code, `setup.py`),
in the hook's sandbox (engine/process/runner.py `sandbox_spec`, docs/security.md): as the plugin's own identity, the
service's files concealed, only `writable` writable, network only when asked. Used by engine/plugins/requirements.py
(`install-deps`). The process runs under the keeper/init of the sandbox like a hook (nothing it starts outlives it),
from the caller's process (a one-off: no spare, no spawner), its stdout and stderr merged and returned."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from pathlib import Path

from engine.filecache import real_path
from engine.home import Home
from engine.process import hook_dirs, hook_view, identity, plugin_files, sandbox
from engine.process.runner import (
    DEFAULT_MAX_DISK_MB,
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_MAX_PROCESSES,
    EnterSandbox,
)


@dataclasses.dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: Path  # the plugin's directory (read-only)
    plugin: str
    env: dict[str, str]
    writable: tuple[Path, ...] = ()  # made by the caller; handed to the plugin's identity here
    read_only: tuple[str, ...] = ()  # more paths bound back read-only (e.g. the service's pip)
    network: bool = False
    home_dir: Path | None = None  # $LIBREFANG_HOME (Home.from_env() when None)


def run(command: Command, timeout: float) -> tuple[bool, str]:
    """(ok, output). Killed whole after `timeout` seconds."""
    ids = identity.plugin_ids(command.home_dir, command.plugin)
    try:
        if ids is not None:
            as_owner = plugin_files.privileged()
            hook_dirs.make_readable(command.cwd, None, ids[1], as_owner)
            for path in command.writable:
                if as_owner is None:
                    hook_dirs.hand_over(path, ids)
                else:
                    as_owner(hook_dirs.hand_over, path, ids)
    except OSError as exc:
        return False, f"cannot prepare the plugin's directories for its identity: {exc}"
    spec = _spec(command, ids)
    cgroup_dirs = sandbox.cgroups.create(*spec.cgroup_limits) if spec.cgroup_limits else ()
    try:
        try:
            proc = subprocess.Popen(command.argv, cwd=spec.cwd, env=spec.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True,
                                    preexec_fn=EnterSandbox(dataclasses.replace(spec, cgroups=cgroup_dirs)))
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"cannot run {command.argv[0]}: {exc}"
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the keeper: its init, and so the whole namespace, die with it
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
            return False, out.decode("utf-8", "replace") + f"\nkilled: timed out after {timeout:g}s"
    finally:
        sandbox.cgroups.release(cgroup_dirs)
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        return False, text + f"\nexit code {proc.returncode}"
    return True, text


def _spec(command: Command, ids: tuple[int, int] | None) -> sandbox.SandboxSpec:
    mode = sandbox.mode()
    isolate = mode is not None
    home = real_path(command.home_dir or Home.from_env().root)
    covers = hook_view.covers(True) if isolate else ()
    disk = DEFAULT_MAX_DISK_MB * 1024 * 1024
    keep = (str(command.cwd), *map(str, command.writable), *command.read_only,
            *(hook_view.bound_back(command.argv[0], covers, command.network) if isolate else ()))
    return sandbox.SandboxSpec(
        cwd=str(command.cwd), env=command.env, rlimits=(("RLIMIT_FSIZE", disk, disk),), isolate=isolate,
        user_ns=mode in ("userns", "subids"), mapped=sandbox.mapped_ids() if isolate else (),
        new_net=not command.network and sandbox.network_isolation_available(),
        hide=home if home != "/" else None, keep=keep, writable=tuple(map(str, command.writable)),
        cgroup_limits=((DEFAULT_MAX_MEMORY_MB * 1024 * 1024, DEFAULT_MAX_PROCESSES + 2)
                       if sandbox.cgroups.available() and isolate else ()),
        uid=os.getuid(), gid=os.getgid(), hook_uid=ids[0] if ids and isolate else -1,
        hook_gid=ids[1] if ids and isolate else -1, conceal=covers, tmp_mb=DEFAULT_MAX_DISK_MB if isolate else 0,
        seccomp=isolate and sandbox.seccomp_filter() is not None)
