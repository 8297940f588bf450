"""How a supervised child ended, in words for people and with the log level its cause deserves.

- an exit the supervisor did not ask for is an error (a non-zero code, a crash signal, SIGKILL), or a warning when
  it looks deliberate (code 0; SIGTERM, SIGINT, SIGHUP or SIGQUIT from someone else);
- SIGKILL is what the kernel's OOM killer sends, so it is flagged as a possible out-of-memory kill (the kernel log
  says for sure: `dmesg`, `journalctl -k`);
- a child that could not even be started (fork or exec failed) ends as an error too, with the reason.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})  # someone asked it to stop
OOM_HINT = " (possibly out of memory)"


@dataclass(frozen=True)
class Exit:
    pid: int | None  # None when the child never started
    code: int | None  # exit code, None when killed by a signal
    signal: str | None  # "SIGKILL", ...
    words: str  # "code 3", "SIGKILL", "could not start: No such file or directory"

    @property
    def cause(self) -> str:
        """The words for an exit nobody asked for (the supervisor's own SIGKILL at shutdown is no OOM)."""
        return self.words + (OOM_HINT if self.signal == "SIGKILL" else "")

    @property
    def deliberate(self) -> bool:
        """Exited cleanly or was asked to stop: how a child should end when the supervisor stops it."""
        return self.code == 0 or self.signal in STOP_SIGNALS

    @property
    def level(self) -> int:
        """The log level of this exit when the supervisor did not ask for it."""
        return logging.WARNING if self.deliberate else logging.ERROR

    def as_dict(self) -> dict:
        return {"pid": self.pid, "code": self.code, "signal": self.signal, "cause": self.cause}


def from_returncode(pid: int, returncode: int) -> Exit:
    """A Popen return code: negative means killed by that signal."""
    if returncode >= 0:
        return Exit(pid, returncode, None, f"code {returncode}")
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return Exit(pid, None, name, name)


def not_started(error: OSError) -> Exit:
    return Exit(None, None, None, f"could not start: {error.strerror or error}")
