"""A real service for end-to-end tests: daphne + worker processes + Redis, on a free port, with its own home,
database file and Redis prefix."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from engine.process import data_disks
from librefang_site.cli import access_log_args
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveService:
    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        (self.home / "plugins").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "librefang_site.settings",
            "LIBREFANG_HOME": str(self.home),
            "LIBREFANG_DB": str(root / "e2e.sqlite3"),
            "LIBREFANG_REDIS_PREFIX": f"lfe2e-{uuid.uuid4().hex[:8]}",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DATABASE_URL", None)  # e2e always uses its own SQLite file
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)

    # ---- lifecycle ----

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "manage.py"), *args], env=self.env, cwd=REPO,
                              capture_output=True, text=True, check=check, timeout=120)

    def start(self, workers: int = 1) -> LiveService:
        self.manage("migrate", "--noinput")
        self.manage("firstrun", "--url", self.url + "/")
        self.token = (self.home / "api_token").read_text().strip()
        self.password = (self.home / "admin_password").read_text().strip()
        # twisted listens with a backlog of 50 by default: a burst of agents would see connection resets
        self.web = self._spawn("web", [sys.executable, "-m", "daphne", "-e",
                                       f"tcp:port={self.port}:interface=127.0.0.1:backlog=1024",
                                       *access_log_args(self.env), "librefang_site.web:application"])
        for _ in range(workers):
            self.start_worker()
        self.wait_healthy(workers)
        return self

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}-{len(self.workers)}-{time.time():.0f}.log", "ab")  # noqa: SIM115
        return subprocess.Popen(argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def start_worker(self) -> subprocess.Popen:
        proc = self._spawn("worker", [sys.executable, str(REPO / "manage.py"), "worker"])
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen | None = None, sig: int = signal.SIGKILL) -> None:
        proc = proc or self.workers[-1]
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
        self.workers.remove(proc)

    def wait_healthy(self, workers: int = 1, timeout: float = 30) -> dict:
        _, body = wait_until(lambda: self.request("GET", "/api/health", auth=False), timeout,
                             f"the service healthy with {workers} worker(s) (logs in {self.logs})",
                             until=lambda seen: seen[0] == 200 and len(seen[1].get("workers", [])) >= workers,
                             ignoring=(urllib.error.URLError, ConnectionError, OSError))
        return body

    def stop(self) -> None:
        for proc in [*self.workers, self.web]:
            if proc and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in [*self.workers, self.web]:
            if proc:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)
        data_disks.release_all(self.home)  # as `librefang start` does when it stops (librefang_site/supervisor.py)

    # ---- HTTP ----

    def request(self, method: str, path: str, body=None, *, auth=True, token: str | None = None,
                timeout: float = 60, raw: bytes | None = None, headers: dict | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {token or self.token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode()
                return resp.status, (json.loads(text) if text and resp.headers.get_content_type() == "application/json"
                                     else text)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text

    def hook(self, hook: str, body: dict, **kw):
        return self.request("POST", f"/api/context-engine/hooks/{hook}", body, **kw)


@contextlib.contextmanager
def running_service(root: Path, workers: int = 1):
    """A started LiveService, stopped (with all its processes) however the block ends."""
    service = LiveService(root)
    try:
        service.start(workers=workers)
        yield service
    finally:
        service.stop()
