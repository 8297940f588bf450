"""The `librefang` command: `start` runs the whole service; everything else maps to a management command.

  librefang start                 migrate, first-run setup, Redis check, daphne + LIBREFANG_WORKERS workers
  librefang worker                one hook worker
  librefang plugin ACTION …       list | show | scaffold | reload | enable | disable | doctor | lint | install |
                                  uninstall | update | install-deps | test-hook | use   (`librefang plugin -h`)
  librefang token ACTION …        create --role owner|admin|viewer|agent --name N | list | revoke ID|NAME

Exit codes: 0 ok, 1 check or hook failed, 2 invalid input, 3 not found, 4 conflict.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

SETTINGS = "librefang_site.settings"
COMMANDS = {"worker": "worker", "plugin": "plugin", "token": "token", "firstrun": "firstrun", "migrate": "migrate"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if argv[0] == "start":
        return start()
    from django.core.management import execute_from_command_line

    command = COMMANDS.get(argv[0], argv[0])
    execute_from_command_line(["librefang", command, *argv[1:]])
    return 0


def _home() -> Path:
    return Path(os.environ.get("LIBREFANG_HOME", Path.home() / ".librefang")).expanduser()


def _redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def ensure_redis(url: str, home: Path) -> subprocess.Popen | None:
    """Use the Redis at `url`; if none answers, start a private redis-server under $LIBREFANG_HOME."""
    if _redis_reachable(url):
        return None
    server = shutil.which("redis-server")
    if server is None:
        sys.exit(
            f"Redis is not reachable at {url} and `redis-server` is not installed.\n"
            "Install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis)\n"
            "or point REDIS_URL at a running Redis, then run `make run` again."
        )
    parsed = urlparse(url)
    data = home / "redis"
    data.mkdir(parents=True, exist_ok=True)
    print(f"Redis not reachable at {url}: starting a private redis-server (data in {data})")
    proc = subprocess.Popen(
        [server, "--bind", parsed.hostname or "127.0.0.1", "--port", str(parsed.port or 6379), "--dir", str(data),
         "--appendonly", "yes", "--save", "", "--logfile", str(data / "redis.log")],
        start_new_session=True,
    )
    for _ in range(100):
        if _redis_reachable(url):
            return proc
        time.sleep(0.1)
    proc.terminate()
    sys.exit(f"started redis-server but it does not answer at {url}; see {data / 'redis.log'}")


def start() -> int:
    import django

    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    (home / "plugins").mkdir(exist_ok=True)
    listen = os.environ.get("LIBREFANG_LISTEN", "127.0.0.1:4545")
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    workers = int(os.environ.get("LIBREFANG_WORKERS", "1"))
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    redis_proc = ensure_redis(redis_url, home)

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    shown_host = f"[{host}]" if ":" in host else host
    call_command("firstrun", url=f"http://{shown_host}:{port}/")

    children: list[subprocess.Popen] = []
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS}
    children.append(subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", host, "-p", port, "--proxy-headers", "librefang_site.asgi:application"],
        env=env,
    ))
    for _ in range(workers):
        children.append(subprocess.Popen([sys.executable, "-m", "librefang_site.cli", "worker"], env=env))
    print(f"  Serving on http://{shown_host}:{port}/ with {workers} worker(s). Ctrl-C stops everything.\n", flush=True)

    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping:
        for child in children:
            if child.poll() is not None:
                print(f"process {child.args[2:4]} exited with {child.returncode}; stopping", file=sys.stderr)
                stopping, code = True, 1
                break
        time.sleep(0.3)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
    if redis_proc is not None:
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
    print("stopped.")
    return code


if __name__ == "__main__":
    sys.exit(main())
