"""A redis-server of a test's own, for tests that kill or restart Redis (never the shared one on 6379)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.e2e.live import LiveService, free_port
from tests.waiting import wait_until


class OwnRedis:
    """A redis-server on a free port with AOF (appendfsync everysec) in `dir`; SIGKILL and restart it at will."""

    def __init__(self, root: Path):
        self.dir = root / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._ping, 20, f"the own redis-server on port {self.port} to answer PING (log: {self.dir})",
                   until=lambda answer: answer == "PONG")

    def _ping(self) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True,
                              timeout=10).stdout.strip()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def service_with_own_redis(root: Path, workers: int = 1):
    """(service, redis): a started LiveService on a redis-server of its own, both stopped however the block ends."""
    redis = OwnRedis(root)
    redis.start()
    service = LiveService(root / "svc")
    service.env["REDIS_URL"] = redis.url
    try:
        service.start(workers=workers)
        yield service, redis
    finally:
        service.stop()
        redis.stop()
