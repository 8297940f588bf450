"""The Redis `librefang start` runs on: the one at REDIS_URL when it answers, otherwise a private redis-server of
its own under $LIBREFANG_HOME/redis, stopped with the service (README.md, "Redis").

The private one is durable (AOF, fsync every second) and password-protected; the password is generated once into
$LIBREFANG_HOME/redis_password (0600) and reaches redis-server through a 0600 config file, never its argv.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

from librefang_site.supervisor import die_with_parent

STOP_SECS = 10.0  # for redis-server to write its AOF and exit, then SIGKILL


class RedisState:
    OK, NEEDS_PASSWORD, DOWN = "ok", "needs_password", "down"


def _probe_redis(url: str) -> str:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping()
        return RedisState.OK
    except redis.AuthenticationError:  # (a ConnectionError subclass: test it first)
        return RedisState.NEEDS_PASSWORD
    except redis.ResponseError as exc:  # NOAUTH, or AUTH sent to a Redis without a password
        return RedisState.NEEDS_PASSWORD if "auth" in str(exc).lower() else RedisState.DOWN
    except (redis.RedisError, OSError):
        return RedisState.DOWN


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that already existed


def redis_password(home: Path) -> str:
    """The private Redis's password, generated on first use into $LIBREFANG_HOME/redis_password (0600)."""
    path = home / "redis_password"
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = secrets.token_urlsafe(32)  # URL-safe: it goes into REDIS_URL as is
    _write_private(path, value + "\n")
    return value


def with_password(url: str, password: str) -> str:
    parsed = urlparse(url)
    host = f"[{parsed.hostname}]" if parsed.hostname and ":" in parsed.hostname else (parsed.hostname or "127.0.0.1")
    netloc = f":{quote(password, safe='')}@{host}:{parsed.port or 6379}"
    return urlunparse(parsed._replace(netloc=netloc))


def redis_config(*, host: str, port: int, data: Path, password: str) -> str:
    """Durable (AOF, fsync every second: at most ~1 s of accepted jobs is lost if the machine itself dies; a
    crash of redis-server alone loses nothing) and password-protected."""
    return "\n".join([
        f"bind {host}", f"port {port}", f'dir "{data}"', f'logfile "{data / "redis.log"}"',
        "appendonly yes", "appendfsync everysec", 'save ""', "daemonize no", f'requirepass "{password}"', "",
    ])


def ensure_redis(url: str, home: Path) -> tuple[str, subprocess.Popen | None]:
    """The Redis URL every process should use, and the private redis-server we started (or None).

    If a Redis answers at `url`, it is used as it is. Otherwise a private redis-server is started under
    $LIBREFANG_HOME/redis with AOF and a password; the password goes into the returned URL, never into argv.
    """
    state = _probe_redis(url)
    if state == RedisState.OK:
        return url, None
    parsed = urlparse(url)
    if parsed.scheme != "redis":  # rediss:// or unix://: someone else's Redis, which we cannot stand in for
        sys.exit(f"Redis is not reachable at {url}; start it, or unset REDIS_URL to let `make run` start its own.")
    private_url = with_password(url, parsed.password or redis_password(home))
    if state == RedisState.NEEDS_PASSWORD:
        if _probe_redis(private_url) == RedisState.OK:  # our private Redis, left by a run that was killed
            print(f"Using the private Redis already running at {parsed.hostname}:{parsed.port or 6379}")
            return private_url, None
        sys.exit(f"The Redis at {url} requires a password: put it in REDIS_URL (redis://:PASSWORD@host:port/0).")
    server = shutil.which("redis-server")
    if server is None:
        sys.exit(
            f"Redis is not reachable at {url} and `redis-server` is not installed.\n"
            "Install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis)\n"
            "or point REDIS_URL at a running Redis, then run `make run` again."
        )
    data = home / "redis"
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    conf = data / "redis.conf"
    _write_private(conf, redis_config(host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379, data=data,
                                      password=parsed.password or redis_password(home)))
    print(f"Redis not reachable at {url}: starting a private redis-server (AOF, password; data in {data})")
    # Its own session, so Ctrl-C reaches the supervisor only and Redis outlives the workers' last writes.
    proc = subprocess.Popen([server, str(conf)], start_new_session=True, preexec_fn=die_with_parent)
    for _ in range(100):
        if _probe_redis(private_url) == RedisState.OK:
            return private_url, proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.terminate()
    sys.exit(f"started redis-server but it does not answer at {parsed.hostname}:{parsed.port or 6379}; "
             f"see {data / 'redis.log'}")


def stop(proc: subprocess.Popen) -> None:
    """Stops the private redis-server: SIGTERM (it writes its AOF and exits), SIGKILL after STOP_SECS."""
    proc.terminate()
    try:
        proc.wait(timeout=STOP_SECS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
