"""Per-call cgroups for a hook's memory and process-count limits, made by the service (or the zygote's spare,
engine/process/warmstart_zygote.py) and joined by engine/process/sandbox_enter.py `enter`. Stdlib only and loaded
outside the engine package in the zygote and the spawner, like engine/process/sandbox.py.
"""

import atexit
import os
import sys
import threading

from .pids import alive


def unescape_mountinfo(raw: bytes) -> bytes:
    """A /proc/self/mountinfo field with its octal escapes (\\040 for a space) decoded."""
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i:i + 1] == b"\\" and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


class Cgroups:
    """One cgroup per call under the service's own, with memory and pids limits, where the service may create them
    (cgroup v1 `memory`/`pids` hierarchies, or cgroup v2 with those controllers enabled for its children). Found
    once per process; `available()` lists what is enforced. Leftovers that are still busy are retried later."""

    _FILES = {"memory": {1: "memory.limit_in_bytes", 2: "memory.max"}, "pids": {1: "pids.max", 2: "pids.max"}}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bases: dict | None = None  # controller -> (version, directory)
        self._pending: list = []
        self._count = 0

    def available(self) -> list:
        return sorted(self._found())

    def create(self, memory_bytes: int | None, pids: int | None) -> tuple:
        """Directories of a fresh cgroup (one per hierarchy) with these limits; () where none can be made."""
        made = self.prepare(c for c, limit in (("memory", memory_bytes), ("pids", pids)) if limit)
        if made and not self.limit(made, memory_bytes, pids):
            self.release(made)
            return ()
        return made

    def prepare(self, controllers=("memory", "pids")) -> tuple:
        """Directories of a fresh cgroup without limits yet (a spawner's spare child joins it ahead of its call:
        joining a cgroup v1 hierarchy waits for an RCU grace period, longest on an idle machine)."""
        bases = self._found()
        with self._lock:
            self._retry_pending()
            self._count += 1
            name = f"librefang-hook-{os.getpid()}-{self._count}"
        made: list = []
        try:
            for controller in controllers:
                if controller in bases:
                    path = os.path.join(bases[controller][1], name)
                    if path not in made:
                        os.mkdir(path)
                        made.append(path)
        except OSError:
            self.release(tuple(made))
            return ()
        return tuple(made)

    def limit(self, paths: tuple, memory_bytes: int | None, pids: int | None) -> bool:
        """Write the limits into a cgroup made by `prepare`; False if one could not be written."""
        bases = self._found()
        try:
            for controller, limit in (("memory", memory_bytes), ("pids", pids)):
                if not limit or controller not in bases:
                    continue
                version, base = bases[controller]
                path = next((p for p in paths if os.path.dirname(p) == base), None)
                if path is None:
                    return False
                with open(os.path.join(path, self._FILES[controller][version]), "w") as fh:
                    fh.write(str(limit))
        except OSError:
            return False
        return True

    def oom_killed(self, paths: tuple) -> bool:
        """Whether the kernel killed a process of this call for exceeding its memory limit."""
        return oom_killed(paths)

    def release(self, paths: tuple) -> None:
        for path in paths:
            if not _rmdir_soon(path):
                with self._lock:
                    if not self._pending:
                        atexit.register(self._retry_pending)  # last chance when the service exits
                    self._pending.append(path)

    def _retry_pending(self) -> None:
        still = []
        for path in self._pending:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                still.append(path)
        self._pending = still

    def _found(self) -> dict:
        if self._bases is None:
            with self._lock:
                if self._bases is None:
                    self._bases = _find_cgroup_bases() if sys.platform.startswith("linux") else {}
                    _remove_stale({base for _version, base in self._bases.values()})
        return self._bases


def _find_cgroup_bases() -> dict:
    try:
        with open("/proc/self/cgroup") as fh:
            own = [line.rstrip("\n").split(":", 2) for line in fh if line.count(":") >= 2]
        with open("/proc/self/mountinfo", "rb") as fh:
            mountinfo = fh.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return {}
    v1_mounts, v2_mount = {}, None
    for line in mountinfo:
        left, _, right = line.partition(" - ")
        fstype, _source, *rest = right.split(" ")
        point = unescape_mountinfo(left.split(" ")[4].encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")
        if fstype == "cgroup2":
            v2_mount = v2_mount or point
        elif fstype == "cgroup" and rest:
            for option in rest[0].split(","):
                v1_mounts.setdefault(option, point)
    bases = {}
    for _hid, controllers, path in own:
        for controller in ("memory", "pids"):
            if controllers and controller in controllers.split(",") and controller in v1_mounts:
                bases[controller] = (1, v1_mounts[controller] + path.rstrip("/"))
            elif controllers == "" and v2_mount and controller not in bases:
                directory = v2_mount + path.rstrip("/")
                try:
                    with open(os.path.join(directory, "cgroup.subtree_control")) as fh:
                        enabled = fh.read().split()
                except OSError:
                    enabled = []
                if controller in enabled:
                    bases[controller] = (2, directory)
    return {c: b for c, b in bases.items() if _can_create_under(b[1], Cgroups._FILES[c][b[0]])}


def _rmdir_soon(path: str, within: float = 0.05) -> bool:
    """Remove an empty cgroup; a namespace killed at timeout may take a few ms to empty it."""
    import time

    end = time.monotonic() + within
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)


def _remove_stale(bases: set) -> None:
    """Empty per-call cgroups left by a service process that died (SIGKILL) before removing them."""
    for base in bases:
        try:
            names = [n for n in os.listdir(base) if n.startswith("librefang-hook-")]
        except OSError:
            continue
        for name in names:
            owner = name.split("-")[2]
            if owner.isdigit() and not alive(int(owner)):
                try:
                    os.rmdir(os.path.join(base, name))
                except OSError:
                    pass


def _can_create_under(base: str, limit_file: str) -> bool:
    probe_dir = os.path.join(base, f"librefang-probe-{os.getpid()}")
    try:
        os.mkdir(probe_dir)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        return os.access(os.path.join(probe_dir, limit_file), os.W_OK) and \
            os.access(os.path.join(probe_dir, "cgroup.procs"), os.W_OK)
    finally:
        try:
            os.rmdir(probe_dir)
        except OSError:
            pass


cgroups = Cgroups()


def oom_killed(paths: tuple) -> bool:
    """Whether the kernel killed a process of the cgroup at `paths` for exceeding its memory limit."""
    for path in paths:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(path, name)) as fh:
                    for line in fh:
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                            return True
            except OSError:
                continue
    return False
