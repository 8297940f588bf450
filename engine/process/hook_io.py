"""Talking to a started hook: the request in on stdin, stdout collected, stderr streamed line by line, the deadline
kept, and the exit classified into a HookResult (engine/process/runner.py starts the process)."""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import time

from engine import protocol as P
from engine.process.hook_call import HookResult, StderrCallback
from engine.protocol import Failure

# After the hook itself exits, how long we keep reading pipes that a grandchild may still hold open.
GRANDCHILD_GRACE_SECS = 0.2
READ_CHUNK = 65536


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


class _LineSplitter:
    """Turns stderr chunks into lines for the callback, as they arrive."""

    def __init__(self, callback: StderrCallback | None):
        self.callback = callback
        self.partial = b""

    def feed(self, chunk: bytes) -> None:
        if self.callback is None:
            return
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        for line in lines:
            self._emit(line)

    def flush(self) -> None:
        if self.partial:
            self._emit(self.partial)
            self.partial = b""

    def _emit(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip() and self.callback is not None:
            try:
                self.callback(text)
            except Exception:  # a broken sink must never break the hook call
                pass


def communicate(proc: subprocess.Popen, payload: bytes, timeout: float, started: float,
                 on_stderr: StderrCallback | None) -> HookResult:
    deadline = started + timeout
    out = bytearray()
    err = bytearray()
    splitter = _LineSplitter(on_stderr)
    sel, pidfd = _watch(proc, payload)
    written = 0
    failure: Failure | None = None
    exited_at: float | None = None
    open_readers = 2
    try:
        while open_readers:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > GRANDCHILD_GRACE_SECS:
                _kill_group(proc)  # a grandchild still holds our pipes; the hook itself is done
                break
            if now >= deadline:
                _kill_group(proc)
                failure = Failure(P.TIMEOUT, f"hook did not finish within {timeout:g}s; its process group was killed")
                break
            wait = deadline - now
            if exited_at is not None:
                wait = min(wait, GRANDCHILD_GRACE_SECS)
            elif pidfd is None:
                wait = min(wait, 0.05)
            for key, _ in sel.select(wait):
                tag = key.data
                if tag == "exit":
                    sel.unregister(key.fileobj)
                    exited_at = exited_at or time.monotonic()
                elif tag == "in":
                    try:
                        written += os.write(proc.stdin.fileno(), payload[written:written + READ_CHUNK])
                    except (BrokenPipeError, OSError) as exc:  # hook ignored or closed stdin: that's fine
                        if isinstance(exc, OSError) and exc.errno not in (errno.EPIPE, errno.EBADF, errno.EAGAIN):
                            failure = Failure(P.IO_ERROR, f"writing the request failed: {exc}")
                        written = len(payload)
                    if written >= len(payload):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                else:
                    stream = out if tag == "out" else err
                    try:
                        chunk = os.read(key.fileobj.fileno(), READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_readers -= 1
                        continue
                    stream += chunk
                    if tag == "err":
                        splitter.feed(chunk)
                    if len(stream) > P.STREAM_CAP_BYTES:
                        _kill_group(proc)
                        name = "stdout" if tag == "out" else "stderr"
                        failure = Failure(P.OUTPUT_OVERFLOW,
                                          f"hook wrote more than {P.STREAM_CAP_BYTES} bytes on {name}; child killed")
                        open_readers = 0
                        break
            if failure is not None:
                break
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    splitter.flush()
    returncode = _reap(proc, deadline)
    return _judged(failure, returncode, out, err, started, timeout)


def _watch(proc: subprocess.Popen, payload: bytes) -> tuple[selectors.BaseSelector, int | None]:
    """The hook's pipes, non-blocking, in a selector (stdin only while there is a request to write), and its pidfd
    where the kernel has them (its exit wakes the loop rather than a 50 ms poll)."""
    sel = selectors.DefaultSelector()
    assert proc.stdin and proc.stdout and proc.stderr
    for f in (proc.stdin, proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    if payload:
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
    else:
        proc.stdin.close()
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):
        pidfd = None
    return sel, pidfd


def _judged(failure: Failure | None, returncode: int | None, out: bytearray, err: bytearray, started: float,
            timeout: float) -> HookResult:
    """What the finished hook amounts to: the loop's failure, else its exit status, else its parsed output."""
    elapsed = (time.monotonic() - started) * 1000
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    if failure is None and returncode is None:
        failure = Failure(P.TIMEOUT, f"hook did not exit within {timeout:g}s; its process group was killed")
    if failure is not None:
        return HookResult(False, failure=failure, stderr=stderr, stdout=stdout, elapsed_ms=elapsed, returncode=returncode)
    if returncode != 0:
        label, code, sig = P.classify_exit(returncode)
        tail = stderr.strip()[-500:]
        message = f"{label}" + (f": {tail}" if tail else "")
        return HookResult(False, failure=Failure(P.SCRIPT_ERROR, message, code, sig), stderr=stderr, stdout=stdout,
                          elapsed_ms=elapsed, returncode=returncode)
    try:
        reply = P.parse_output(stdout)
    except P.EmptyOutput as exc:
        return HookResult(False, failure=Failure(P.EMPTY_OUTPUT, str(exc)), stderr=stderr, stdout=stdout,
                          elapsed_ms=elapsed, returncode=0)
    return HookResult(True, reply=reply, stderr=stderr, stdout=stdout, elapsed_ms=elapsed, returncode=0)


def _reap(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.05, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        return None
