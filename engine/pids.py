"""Whether a process id still names a running process: `alive`, kept in engine/process/pids.py where the sandbox's
stdlib-only modules can import it too (they run in the zygote, outside the engine package)."""

from engine.process.pids import alive

__all__ = ["alive"]
