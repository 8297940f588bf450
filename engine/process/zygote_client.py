"""The worker's side of one zygote (engine/process/warmstart_zygote.py) or of the spawner
(engine/process/hook_spawner.py): `Zygote` starts it and hands it a call (engine/process/zygote_wire.py: the hook's
pipe ends and a reply socket, then the JSON spec), and `WarmProcess` is the forked child as the runner drives it,
like a subprocess.Popen. Which zygotes run, and when a call goes to one, is engine/process/warmstart.py.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.process.zygote_wire import HEADER, send_call

log = logging.getLogger("librefang.warmstart")

ZYGOTE_SCRIPT = Path(__file__).with_name("warmstart_zygote.py")
SPAWNER_SCRIPT = Path(__file__).with_name("hook_spawner.py")  # the same loop, exec'ing any hook (cold hooks)
SANDBOX_MODULE = Path(__file__).with_name("sandbox.py")  # loaded in the zygote with its stdlib-only siblings
READY_TIMEOUT_SECS = 15.0
PID_TIMEOUT_SECS = 10.0


class WarmProcess:
    """A zygote child, driven through the same interface as subprocess.Popen by the runner's loop."""

    def __init__(self, args: list[str], pid: int, reply: socket.socket, buf: bytes, stdin: int, stdout: int,
                 stderr: int, stdin_written: int = 0):
        self.args = args
        self.stdin_written = stdin_written  # bytes of the request already in the stdin pipe (`Zygote.fork`)
        self.pid = pid
        self.returncode: int | None = None
        self.zygote_lost = False
        self.oom_killed = False  # the kernel killed a process of the call's cgroup for its memory limit
        self._reply = reply
        self._buf = buf
        self.stdin = open(stdin, "wb", buffering=0)  # noqa: SIM115 - closed by the runner
        self.stdout = open(stdout, "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(stderr, "rb", buffering=0)  # noqa: SIM115
        self._take_lines()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(remaining)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _read(self, timeout: float | None) -> None:
        if self._reply is None:
            return
        poller = select.poll()  # not select(): a busy worker may hold fds above FD_SETSIZE
        poller.register(self._reply, select.POLLIN)
        if not poller.poll(None if timeout is None else math.ceil(max(0.0, timeout) * 1000)):
            return
        try:
            chunk = self._reply.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            # The zygote died before reporting: its children die with it (PDEATHSIG), so this one was killed.
            self.zygote_lost = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._finish(-signal.SIGKILL)
            return
        self._buf += chunk
        self._take_lines()

    def _take_lines(self) -> None:
        while b"\n" in self._buf and self.returncode is None:
            line, _, self._buf = self._buf.partition(b"\n")
            msg = json.loads(line)
            if "rc" in msg:
                self.oom_killed = bool(msg.get("oom"))
                self._finish(int(msg["rc"]))

    def _finish(self, rc: int) -> None:
        self.returncode = rc
        if self._reply is not None:
            self._reply.close()
            self._reply = None


class Zygote:
    """The worker's handle on one zygote process."""

    def __init__(self, launcher: str, env: Mapping[str, str], script: Path = ZYGOTE_SCRIPT):
        self.launcher = launcher
        self.script = script
        self.env = dict(env)
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.pid: int | None = None
        self.calls = 0
        self.broken = False

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [self.launcher, str(self.script), str(theirs.fileno()), str(SANDBOX_MODULE)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),), env=self.env, cwd="/", start_new_session=True, close_fds=True,
            )
        finally:
            theirs.close()
        # Its stdio are pipes, as a hook's are (so sys.std* are configured the same); nothing is ever written to them.
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        threading.Thread(target=_drain, args=(self.proc,), name="zygote-stderr", daemon=True).start()
        ours.settimeout(READY_TIMEOUT_SECS)
        try:
            hello = json.loads(ours.recv(4096) or b"{}")
        except (OSError, ValueError) as exc:
            hello = {"ready": False, "why": f"no handshake: {exc}"}
        if not hello.get("ready"):
            ours.close()
            self.stop()
            raise ZygoteUnavailable(hello.get("why") or "zygote exited during start-up")
        ours.settimeout(None)
        self.ctl = ours
        self.pid = hello.get("pid")

    def alive(self) -> bool:
        return not self.broken and self.proc is not None and self.proc.poll() is None and self.ctl is not None

    def stop(self) -> None:
        if self.ctl is not None:
            try:
                self.ctl.close()  # EOF: the zygote exits on its own
            except OSError:
                pass
            self.ctl = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=2)

    def retire(self) -> None:
        """Stop taking calls; the zygote exits once its running hooks are done (they are not killed)."""
        self.broken = True
        try:
            with self.lock:
                if self.ctl is not None:
                    self.ctl.send(HEADER.pack(0))
        except OSError:
            pass
        threading.Thread(target=self._close_when_done, name="zygote-retire", daemon=True).start()

    def _close_when_done(self) -> None:
        # The control socket stays open until the zygote has exited: its EOF means "the worker died, stop now".
        if self.proc is not None:
            self.proc.wait()
        self.stop()

    def fork(self, script: str, sandbox: Any, argv: Sequence[str] | None = None,
             stdin: bytes = b"") -> WarmProcess | None:
        """Fork `script` with `sandbox` (engine/process/sandbox.py's SandboxSpec) applied in the child; a spawner (exec mode)
        execs `argv` instead. Raises OSError when that exec failed (as subprocess.Popen does).

        `stdin` (the request) goes into the stdin pipe before the call is handed over, as much as the pipe holds
        (`WarmProcess.stdin_written`; the caller writes the rest): the hook does not wait for our next wake-up to
        read it."""
        call = {"sandbox": dict(vars(sandbox))}  # its fields (a flat dataclass): the JSON of SandboxSpec.to_json
        call.update({"argv": list(argv)} if argv is not None else {"script": script, "launcher": self.launcher})
        spec = json.dumps(call).encode()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        in_r, in_w = os.pipe()
        stdin_written = _prefill(in_w, stdin)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        mine = [in_w, out_r, err_r]
        exec_r, exec_w = os.pipe() if argv is not None else (None, None)
        try:
            fds = [theirs.fileno(), in_r, out_w, err_w] + ([exec_w] if exec_w is not None else [])
            with self.lock:
                if self.ctl is None:
                    raise ConnectionError("zygote stopped")
                send_call(self.ctl, len(spec), fds)
        except OSError:
            self.broken = True
            ours.close()
            for fd in mine:
                os.close(fd)
            return None
        finally:
            theirs.close()
            for fd in (in_r, out_w, err_w, exec_w):
                if fd is not None:
                    os.close(fd)
        try:
            ours.settimeout(PID_TIMEOUT_SECS)
            ours.sendall(spec)
            buf = b""
            while b"\n" not in buf:
                chunk = ours.recv(4096)
                if not chunk:
                    raise ConnectionError("zygote closed the call")
                buf += chunk
            ours.settimeout(None)
            line, _, rest = buf.partition(b"\n")
            msg = json.loads(line)
            if "pid" not in msg:
                raise ConnectionError(msg.get("error") or "zygote refused the call")
        except (OSError, ValueError) as exc:
            log.warning("warm start: zygote %s could not fork (%s); spawning normally", self.pid, exc)
            if not isinstance(exc, ValueError) and "refused" not in str(exc):
                self.broken = True
            ours.close()
            for fd in mine + ([exec_r] if exec_r is not None else []):
                os.close(fd)
            return None
        self.calls += 1
        proc = WarmProcess(list(argv) if argv is not None else [self.launcher, script], int(msg["pid"]), ours, rest,
                           in_w, out_r, err_r, stdin_written)
        if exec_r is not None:
            _raise_exec_error(proc, exec_r)
        return proc


class ZygoteUnavailable(Exception):
    pass


def _prefill(fd: int, data: bytes) -> int:
    """Write what an empty pipe takes of `data` without blocking; how many bytes went in."""
    if not data:
        return 0
    os.set_blocking(fd, False)
    try:
        return os.write(fd, data[:_PIPE_PREFILL])
    except OSError:  # full (another size of pipe): the runner writes it all
        return 0


_PIPE_PREFILL = 65536  # a pipe's default capacity on Linux (pipe(7))


def _raise_exec_error(proc: WarmProcess, exec_r: int) -> None:
    """Wait until the spawner's child has exec'd (the pipe closes on exec) or failed to (it writes the errno)."""
    data = b""
    try:
        poller = select.poll()
        poller.register(exec_r, select.POLLIN)
        end = time.monotonic() + PID_TIMEOUT_SECS
        while time.monotonic() < end:
            if not poller.poll(math.ceil((end - time.monotonic()) * 1000)):
                continue
            chunk = os.read(exec_r, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(exec_r)
    if data:
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
        try:
            proc.wait(timeout=PID_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            proc.kill()
        code = int(data) if data.isdigit() else 0
        raise OSError(code, os.strerror(code))  # FileNotFoundError, PermissionError ... as Popen raises them


def _drain(proc: subprocess.Popen) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        log.warning("zygote %s: %s", proc.pid, raw.decode("utf-8", "replace").rstrip())
