"""`librefang plugin …` and `librefang token …`: real subprocesses for exit codes and output, against a private
home and database."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_factory import PY_ECHO_INGEST, make_plugin
from tests.waiting import pid_gone, wait_until

REPO = Path(__file__).resolve().parents[2]


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(db, home, monkeypatch):
    """Runs `librefang <args>` in-process (same argument parsing and exit codes as the entry point)."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    def run(*args, input=None):
        out, err = io.StringIO(), io.StringIO()
        if input is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(input))
        try:
            call_command(*args, stdout=out, stderr=err)
            code = 0
        except CommandError as exc:
            code, _ = exc.returncode, err.write(str(exc))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return Result(code, out.getvalue(), err.getvalue())

    run.home = home.root
    return run


def test_it_prints_the_new_token_alone_on_the_last_line_of_the_real_command(tmp_path):
    env = {**os.environ, "LIBREFANG_HOME": str(tmp_path / "home"), "LIBREFANG_DB": str(tmp_path / "db.sqlite3"),
           "DJANGO_SETTINGS_MODULE": "librefang_site.settings"}
    env.pop("DATABASE_URL", None)
    cmd = [sys.executable, "-m", "librefang_site.cli"]
    subprocess.run([*cmd, "migrate", "-v0"], env=env, cwd=REPO, check=True, capture_output=True, timeout=120)
    r = subprocess.run([*cmd, "token", "create", "--role", "agent", "--name", "a1"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("lf_") and len(r.stdout.splitlines()) == 1
    r = subprocess.run([*cmd, "plugin", "show", "ghost"], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3 and "not installed" in r.stderr


def test_it_creates_lists_and_revokes_tokens(cli):
    r = cli("token", "create", "--role", "viewer", "--name", "ci-bot")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip().splitlines()[-1]
    assert token.startswith("lf_") and len(token) > 30
    listed = json.loads(cli("token", "list", "--json").stdout)
    row = next(t for t in listed if t["name"] == "ci-bot")
    assert row["role"] == "viewer" and token not in json.dumps(listed)
    assert cli("token", "revoke", str(row["id"])).returncode == 0
    assert not any(t["name"] == "ci-bot" for t in json.loads(cli("token", "list", "--json").stdout))
    assert cli("token", "revoke", "no-such-token").returncode == 3
    assert cli("token", "create", "--role", "admin", "--name", "  ").returncode == 2


def test_it_scaffolds_lists_lints_and_test_hooks(cli):
    r = cli("plugin", "scaffold", "clip", "--runtime", "python", "--hook", "ingest", "--hook", "compact")
    assert r.returncode == 0, r.stderr
    assert cli("plugin", "scaffold", "clip").returncode == 4
    assert cli("plugin", "scaffold", "bad name").returncode == 2
    assert "invalid_name" in cli("plugin", "scaffold", "bad name").stderr
    listed = json.loads(cli("plugin", "list", "--json").stdout)
    assert [p["name"] for p in listed] == ["clip"]
    assert cli("plugin", "lint", "clip").returncode == 0
    assert cli("plugin", "lint", "ghost").returncode == 3
    r = cli("plugin", "test-hook", "clip", "ingest", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["reply"]["type"] == "ingest_result" and out["via"]
    r = cli("plugin", "test-hook", "clip", "ingest", "--input", "-", input='{"agent_id": "a", "message": "hi"}')
    assert r.returncode == 0 and json.loads(r.stdout)["type"] == "ingest_result"
    assert cli("plugin", "test-hook", "clip", "ingest", "--input", "{oops").returncode == 2
    assert cli("plugin", "test-hook", "clip", "ingest", "--input", '{"agent_id": 1}').returncode == 2
    assert cli("plugin", "test-hook", "clip", "assemble").returncode == 1  # not declared
    assert cli("plugin", "test-hook", "ghost", "ingest").returncode == 3


def test_it_manages_lifecycle_and_reports_failures(cli, tmp_path):
    src = make_plugin(tmp_path, "clisrc", {"ingest": PY_ECHO_INGEST})
    r = cli("plugin", "install", str(src))
    assert r.returncode == 0, r.stderr
    assert cli("plugin", "install", str(src)).returncode == 4
    assert cli("plugin", "install").returncode == 2
    assert json.loads((cli.home / "plugins.lock").read_text())["plugins"]["clisrc"]["files"]
    assert cli("plugin", "disable", "clisrc").returncode == 0
    assert json.loads(cli("plugin", "show", "clisrc").stdout)["enabled"] is False
    assert cli("plugin", "enable", "clisrc").returncode == 0
    assert cli("plugin", "use", "clisrc").returncode == 0
    assert 'plugin = "clisrc"' in (cli.home / "config.toml").read_text()
    toml = cli.home / "plugins/clisrc/plugin.toml"
    good = toml.read_text()
    toml.write_text(good + "\n[[[broken\n")
    r = cli("plugin", "reload", "clisrc")
    assert r.returncode == 2 and "invalid_manifest" in r.stderr
    toml.write_text(good)
    assert cli("plugin", "reload", "clisrc").returncode == 0
    assert cli("plugin", "update", "clisrc").returncode == 0
    (cli.home / "plugins/clisrc/hooks/ingest.py").write_text("print('edited')\n")
    assert cli("plugin", "update", "clisrc").returncode == 4
    assert cli("plugin", "update", "clisrc", "--force").returncode == 0
    assert cli("plugin", "uninstall", "clisrc").returncode == 0
    assert cli("plugin", "uninstall", "clisrc").returncode == 3
    r = cli("plugin", "doctor", "--json")
    assert len(json.loads(r.stdout)["runtimes"]) == 12


def test_it_starts_a_private_redis_with_aof_and_a_password_kept_out_of_argv(tmp_path):
    import stat

    import redis

    from librefang_site.private_redis import ensure_redis
    from tests.e2e.live import free_port

    home = tmp_path / "home"
    home.mkdir()
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing answers there
    private_url, proc = ensure_redis(url, home)
    try:
        assert proc is not None
        password = (home / "redis_password").read_text().strip()
        assert len(password) >= 32 and private_url == url.replace("redis://", f"redis://:{password}@")
        for path in (home / "redis_password", home / "redis" / "redis.conf"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url).ping()
        client = redis.Redis.from_url(private_url, decode_responses=True)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert password.encode() not in cmdline.read_bytes(), f"password in argv of {cmdline}"
            except OSError:
                continue
        # A private Redis left running by a killed run is found again with the kept password, not started twice.
        again_url, again_proc = ensure_redis(url, home)
        assert again_url == private_url and again_proc is None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)


def test_it_uses_a_redis_that_answers_as_it_is(tmp_path):
    from librefang_site.private_redis import ensure_redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    assert ensure_redis(url, tmp_path) == (url, None)
    assert not (tmp_path / "redis_password").exists()


@pytest.mark.parametrize("access_log", [False, True])
def test_it_runs_daphne_alone_as_librefang_web(tmp_path, access_log):
    """`librefang web` (what deploy/librefang-web.service runs) becomes daphne itself, so systemd's signals reach it.
    daphne's access log only when LIBREFANG_ACCESS_LOG says where (here a file); by default no line per request."""
    import signal
    import urllib.error
    import urllib.request

    from tests.e2e.live import free_port

    port = free_port()
    env = {**os.environ, "LIBREFANG_HOME": str(tmp_path / "home"), "LIBREFANG_DB": str(tmp_path / "db.sqlite3"),
           "LIBREFANG_LISTEN": f"127.0.0.1:{port}", "DJANGO_SETTINGS_MODULE": "librefang_site.settings"}
    env.pop("DATABASE_URL", None)
    access = tmp_path / "access.log"
    if access_log:
        env["LIBREFANG_ACCESS_LOG"] = str(access)
    cmd = [sys.executable, "-m", "librefang_site.cli"]
    subprocess.run([*cmd, "migrate", "-v0"], env=env, cwd=REPO, check=True, capture_output=True, timeout=120)
    output = tmp_path / "web.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen([*cmd, "web"], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    def health_status() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code  # 503 without workers is still daphne answering

    try:
        status = wait_until(health_status, 60, "daphne to answer", ignoring=(OSError,))
        assert status in (200, 503)
        assert b"daphne" in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        logged = access.read_text() if access.exists() else ""
        assert ("GET /api/health" in logged) is access_log
        assert "GET /api/health" not in output.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def _unit(path: Path) -> dict[str, str]:
    keys = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            keys[key.strip()] = value.strip()
    return keys


def _seconds(value: str) -> float:
    return float(value[:-2]) / 1000 if value.endswith("ms") else float(value.rstrip("s"))


def test_it_ships_systemd_units_that_restart_like_the_supervisor():
    import shutil

    from librefang_site import supervisor

    deploy = REPO / "deploy"
    web, worker = _unit(deploy / "librefang-web.service"), _unit(deploy / "librefang-worker@.service")
    assert web["ExecStart"].endswith("librefang web") and worker["ExecStart"].endswith("librefang worker")
    for unit in (web, worker):
        assert unit["Restart"] == "on-failure" and unit["KillMode"] == "control-group"
        assert _seconds(unit["RestartSec"]) == supervisor.BACKOFF_FIRST_SECS
        assert _seconds(unit["RestartMaxDelaySec"]) == supervisor.BACKOFF_MAX_SECS
        # given up as the supervisor gives up a child: GIVE_UP_AFTER starts fit in the interval only when each
        # ended within about START_SECS (from the first start to the last: the runs before it and the backoff)
        burst, interval = int(unit["StartLimitBurst"]), _seconds(unit["StartLimitIntervalSec"])
        backoff = supervisor.BACKOFF_FIRST_SECS * (2 ** (burst - 1) - 1)  # 0.5 + 1 + 2 + 4 + 8
        assert burst == supervisor.GIVE_UP_AFTER
        assert (burst - 1) * 2 + backoff < interval < (burst - 1) * supervisor.START_SECS + backoff
        assert unit["EnvironmentFile"] == "/etc/librefang/librefang.env"
    env_keys = {line.split("=")[0].lstrip("#") for line in (deploy / "librefang.env.example").read_text().splitlines()
                if "=" in line and not line.startswith("# ")}
    assert {"LIBREFANG_HOME", "REDIS_URL", "LIBREFANG_LISTEN"} <= env_keys
    if shutil.which("systemd-analyze") is None:
        return
    # systemd's own parser, on copies pointing at this checkout (verify checks that ExecStart exists)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        units = []
        for name, instance in (("librefang-web.service", "librefang-web.service"),
                               ("librefang-worker@.service", "librefang-worker@1.service")):
            text = (deploy / name).read_text().replace("/opt/librefang/.venv", str(Path(sys.executable).parents[1]))
            text = text.replace("/opt/librefang", str(REPO)).replace("=librefang\n", "=root\n")
            text = text.replace("/etc/librefang/librefang.env", str(deploy / "librefang.env.example"))
            (Path(tmp) / instance).write_text(text)
            units.append(str(Path(tmp) / instance))
        done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
        problems = [line for line in done.stderr.splitlines()
                    if "RestartSteps" not in line and "RestartMaxDelaySec" not in line]  # keys of systemd >= 254
        assert done.returncode == 0 and problems == [], done.stderr


SUPERVISE = """
import logging, sys
from pathlib import Path
from librefang_site.supervisor import Child, RestartPolicy, Supervisor
logging.basicConfig(level=logging.INFO, format="%(levelname)s librefang: %(message)s", stream=sys.stderr)
home, grandchild_file = Path(sys.argv[1]), sys.argv[2]
# "web" leaves a grandchild in its process group and exits on SIGTERM; "worker" can never start (exits with code 3)
web = [sys.executable, "-c", "import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
       f"open({grandchild_file!r}, 'w').write(str(p.pid)); time.sleep(300)"]
worker = [sys.executable, "-c", "import sys; sys.exit(3)"]
policy = RestartPolicy(first_delay=0.05, give_up_after=3)  # give up sooner than the service does
sys.exit(Supervisor([Child("web", 0, web), Child("worker", 1, worker)], env={}, home=home, policy=policy).run())
"""


def test_it_gives_up_a_worker_starts_it_again_on_sigusr1_and_stops_its_whole_process_groups_on_sigterm(tmp_path):
    """The real process and its signal handlers; the state machine itself: tests/app/test_supervisor_states.py."""
    import signal
    import stat

    from plugins_app.selectors.supervisor import supervisor_status

    home, grandchild_file = tmp_path / "home", tmp_path / "grandchild.pid"
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISE, str(home), str(grandchild_file)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def worker_when(test) -> dict:
        def there(doc: dict | None) -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            worker = doc and next(c for c in doc["children"] if c["role"] == "worker")
            return bool(worker and test(worker) and grandchild_file.exists())

        return wait_until(lambda: supervisor_status(home), 60, "the worker's state", until=there)

    try:
        doc = worker_when(lambda w: w["state"] == "fatal")
        worker = next(c for c in doc["children"] if c["role"] == "worker")
        assert doc["pid"] == proc.pid and worker["failed_starts"] == 3 and worker["restarts"] == 2, doc
        assert {k: worker["last_exit"][k] for k in ("code", "signal", "cause")} == {
            "code": 3, "signal": None, "cause": "code 3"}
        assert isinstance(worker["last_exit"]["pid"], int)  # the pid it reaped: that worker is dead at once
        web = next(c for c in doc["children"] if c["role"] == "web")
        assert web["state"] in ("starting", "running") and web["restarts"] == 0  # a failing worker never touches it
        assert stat.S_IMODE((home / "run" / "supervisor.json").stat().st_mode) == 0o600

        proc.send_signal(signal.SIGUSR1)  # start it again: three more failed starts, then given up again
        worker_when(lambda w: w["state"] == "fatal" and w["restarts"] == 5)

        grandchild = int(grandchild_file.read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=25)
        assert proc.returncode == 0, out
        assert "ERROR librefang: worker 1 (pid " in out and "exited with code 3 after " in out
        assert "; restarting in 0.05 s (restart #1)" in out and "; restarting in 0.1 s (restart #2)" in out
        assert out.count("CRITICAL librefang: worker 1 (pid ") == 2 and "given up after 3 failed starts" in out
        assert "SIGUSR1: starting worker 1 again (given up after 3 failed starts: code 3)" in out
        assert "SIGTERM: stopping" in out
        # the grandchild web left behind went with its process group
        wait_until(lambda: pid_gone(grandchild), 5, f"web's grandchild (pid {grandchild}) gone")
        assert supervisor_status(home) is None and not (home / "run" / "supervisor.json").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if grandchild_file.exists():
            try:
                os.kill(int(grandchild_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
