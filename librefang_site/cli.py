"""The `librefang` command: `start` runs the whole service; everything else maps to a management command.

  librefang start                 migrate, first-run setup, Redis check, then supervise daphne +
                                  LIBREFANG_WORKERS workers (a child that exits is restarted with backoff)
  librefang web                   daphne alone (for systemd or containers; see deploy/)
  librefang worker [--home DIR]   one hook worker; --home sets $LIBREFANG_HOME (a worker host needs no plugins
                                  there: with LIBREFANG_PIN_BUNDLES=1 it runs the versions the jobs name);
                                  --once runs one reclaim + read cycle, waits for those jobs and exits
  librefang plugin ACTION …       list | show | scaffold | reload | enable | disable | doctor | lint | install |
                                  uninstall | update | install-deps | test-hook | use | prewarm [NAME] |
                                  permissions | approve …
                                  (`librefang plugin -h`)
  librefang token ACTION …        create --role owner|admin|viewer|agent --name N | list | revoke ID|NAME
  librefang memory reembed        embed every memory lacking a vector of the [embeddings] model, in batches
                                  (--batch-size N, --agent ID); resumable, progress printed

Exit codes: 0 ok, 1 check or hook failed, 2 invalid input, 3 not found, 4 conflict.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

SETTINGS = "librefang_site.settings"
COMMANDS = {"worker": "worker", "plugin": "plugin", "token": "token", "firstrun": "firstrun", "migrate": "migrate",
            "memory": "memory"}


def _take_home(argv: list[str]) -> list[str]:
    """`--home DIR` becomes $LIBREFANG_HOME before Django reads its settings (which is too late for an option)."""
    out: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--home":
            value = next(rest, None)
            if not value:
                raise SystemExit("librefang worker: --home needs a directory")
            os.environ["LIBREFANG_HOME"] = str(Path(value).expanduser().resolve())
        elif arg.startswith("--home="):
            os.environ["LIBREFANG_HOME"] = str(Path(arg.split("=", 1)[1]).expanduser().resolve())
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    if argv[0] == "start":
        return start()
    if argv[0] == "web":
        return web()
    if argv[0] == "worker":
        argv = _take_home(argv)
    from django.core.management import execute_from_command_line

    command = COMMANDS.get(argv[0], argv[0])
    execute_from_command_line(["librefang", command, *argv[1:]])
    return 0


def _home() -> Path:
    return Path(os.environ.get("LIBREFANG_HOME", Path.home() / ".librefang")).expanduser()


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
    from librefang_site.supervisor import die_with_parent

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


def _listen() -> tuple[str, str]:
    listen = os.environ.get("LIBREFANG_LISTEN", "127.0.0.1:4545")
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "127.0.0.1", port


def daphne_argv(listener: socket.socket | None = None) -> list[str]:
    """daphne on LIBREFANG_LISTEN, or on an already listening socket it inherits."""
    if listener is None:
        host, port = _listen()
        # Twisted's default backlog (50) resets connections when hundreds of agents connect at once.
        where = (["-e", f"tcp:port={port}:interface={host}:backlog=1024"] if ":" not in host
                 else ["-b", host, "-p", port])
    else:
        where = ["--fd", str(listener.fileno())]
    # X-Forwarded-For is believed only behind a configured proxy: daphne would otherwise take any client's
    # header as its address, and the login lockout (plugins_app/views/login.py) keys on that address.
    proxy = ["--proxy-headers"] if os.environ.get("LIBREFANG_TRUSTED_PROXIES", "").strip() else []
    return [sys.executable, "-m", "daphne", *where, *proxy, *access_log_args(os.environ),
            "librefang_site.asgi:application"]


def access_log_args(environ: Mapping[str, str]) -> list[str]:
    """daphne's access log only when LIBREFANG_ACCESS_LOG names where ("-": stdout, else a file). By default daphne
    writes a line per request to stdout, on the event loop before the answer goes out: with agents calling hooks
    that is one line per call of every agent (the calls themselves are recorded: traces, metrics, job records).
    `-v 0` changes nothing else: Django's LOGGING (librefang_site/settings.py) sets the log levels."""
    where = environ.get("LIBREFANG_ACCESS_LOG", "").strip()
    return ["--access-log", where] if where else ["-v", "0"]


def listen_socket(host: str, port: str) -> socket.socket | None:
    """The supervisor holds the listening socket and hands it to each daphne it starts: while daphne restarts,
    new connections wait in the backlog instead of being refused, and a busy port is reported before anything
    starts. IPv4 only (daphne's `--fd` adopts AF_INET sockets); for an IPv6 address daphne binds it itself."""
    ipv4 = [info for info in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            if info[0] == socket.AF_INET]
    if not ipv4:
        return None
    family, kind, proto, _, address = ipv4[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        sys.exit(f"cannot listen on {host}:{port} (LIBREFANG_LISTEN): {exc.strerror}")
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def web() -> int:
    """`librefang web`: daphne alone (for systemd or a container); replaces this process."""
    argv = daphne_argv()
    os.execve(argv[0], argv, {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS})
    return 1  # not reached


def start() -> int:
    import django

    from librefang_site.supervisor import Slot, Supervisor

    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    (home / "plugins").mkdir(exist_ok=True)
    host, port = _listen()
    workers = int(os.environ.get("LIBREFANG_WORKERS", "1"))
    redis_url, redis_proc = ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), home)
    os.environ["REDIS_URL"] = redis_url  # settings and every child read it from here
    try:
        listener = listen_socket(host, port)  # a busy port is reported before anything else happens
        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        shown_host = f"[{host}]" if ":" in host else host
        call_command("firstrun", url=f"http://{shown_host}:{port}/")

        env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS}
        worker_argv = [sys.executable, "-m", "librefang_site.cli", "worker"]
        slots = [Slot("web", 0, daphne_argv(listener), pass_fds=(listener.fileno(),) if listener else ())]
        slots += [Slot("worker", i + 1, worker_argv) for i in range(workers)]
        print(f"  Serving on http://{shown_host}:{port}/ with {workers} worker(s). Ctrl-C stops everything.\n",
              flush=True)
        return Supervisor(slots, env=env, home=home, listener=listener).run()
    finally:
        if redis_proc is not None:
            redis_proc.terminate()  # Redis writes its AOF and exits
            try:
                redis_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                redis_proc.kill()
                redis_proc.wait()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
