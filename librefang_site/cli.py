"""The `librefang` command: `start` runs the whole service; everything else maps to a management command.

  librefang start                 migrate, first-run setup, Redis check, then supervise daphne +
                                  LIBREFANG_WORKERS workers (a child that exits is restarted with backoff, one
                                  that fails 6 starts in a row is given up: librefang_site/supervisor.py)
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
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

SETTINGS = "librefang_site.settings"


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

    execute_from_command_line(["librefang", *argv])  # every other command is the management command of its name
    return 0


def _home() -> Path:
    return Path(os.environ.get("LIBREFANG_HOME", Path.home() / ".librefang")).expanduser()


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
            "librefang_site.web:application"]


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

    from librefang_site import private_redis
    from librefang_site.supervisor import Child, Supervisor

    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    (home / "plugins").mkdir(exist_ok=True)
    host, port = _listen()
    workers = int(os.environ.get("LIBREFANG_WORKERS", "1"))
    redis_url, redis_proc = private_redis.ensure_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), home)
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
        children = [Child("web", 0, daphne_argv(listener), pass_fds=(listener.fileno(),) if listener else ())]
        children += [Child("worker", i + 1, worker_argv) for i in range(workers)]
        print(f"  Serving on http://{shown_host}:{port}/ with {workers} worker(s). Ctrl-C stops everything.\n",
              flush=True)
        return Supervisor(children, env=env, home=home, listener=listener).run()
    finally:
        if redis_proc is not None:
            private_redis.stop(redis_proc)
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
