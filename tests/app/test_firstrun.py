"""`librefang firstrun` (run by every `librefang start`): secrets are printed by the run that creates them and never
again; the printed sample works against a real service; a revoked token is never printed."""

from __future__ import annotations

import io
import re
import stat
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.e2e.live import LiveService


def _field(output: str, label: str) -> str:
    match = re.search(rf"^\s*{label}:\s+(.*)$", output, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{output}"
    return match.group(1)


def _curl_status(command: str) -> str:
    """Runs a printed `curl …` sample in a shell, as an operator would paste it; returns the HTTP status."""
    assert command.startswith("curl ")
    done = subprocess.run(["bash", "-c", command + " -s -o /dev/null -w '%{http_code}'"], capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip()


# seven Django process starts and a live service: the default 120 s is not enough on a loaded 2-core machine
@pytest.mark.timeout(300)
def test_it_prints_secrets_once_with_a_sample_that_works_and_never_a_revoked_token(tmp_path):
    service = LiveService(tmp_path)
    try:
        service.manage("migrate", "--noinput")
        first = service.manage("firstrun", "--url", service.url + "/").stdout
        token = _field(first, "API token").split()[0]
        password = _field(first, "Password").split()[0]
        token_file, password_file = service.home / "api_token", service.home / "admin_password"
        assert token.startswith("lf_") and token_file.read_text().strip() == token
        assert password_file.read_text().strip() == password
        for path in (token_file, password_file):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        sample = _field(first, "Try")
        assert token in sample

        service.start(workers=1)  # runs firstrun again (a second run) before serving
        assert _curl_status(sample) == "200"
        # the sample's route really needs the token: without it the same URL is refused
        assert _curl_status(re.sub(r"-H '[^']*' ", "", sample)) == "401"

        second = service.manage("firstrun", "--url", service.url + "/").stdout
        assert token not in second and password not in second
        assert str(token_file) in second and str(password_file) in second
        assert _curl_status(_field(second, "Try")) == "200"  # later runs' sample reads the token file

        service.manage("token", "revoke", "first-run owner token")
        third = service.manage("firstrun", "--url", service.url + "/").stdout
        assert token not in third and password not in third
        assert "revoked" in _field(third, "API token")
        assert "librefang token create --role owner" in third
        assert "Try:" not in third  # no sample with a token that no longer works
        assert _curl_status(sample) == "401"
    finally:
        service.stop()


def test_it_says_when_the_kept_admin_password_no_longer_works(db, home):
    def run() -> str:
        out = io.StringIO()
        call_command("firstrun", url="http://127.0.0.1:9/", stdout=out)
        return out.getvalue()

    first = run()
    password = _field(first, "Password").split()[0]
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password(password)
    admin.set_password("changed-by-the-operator")
    admin.save()
    later = run()
    assert password not in later and "changed-by-the-operator" not in later
    assert "changed since first run" in _field(later, "Password")
    assert "librefang changepassword admin" in later


def test_it_makes_a_new_token_when_the_kept_one_belongs_to_another_database(db, home):
    (home.root / "api_token").write_text("lf_from_a_database_that_was_deleted\n")
    out = io.StringIO()
    call_command("firstrun", url="http://127.0.0.1:9/", stdout=out)
    token = _field(out.getvalue(), "API token").split()[0]
    assert token.startswith("lf_") and token != "lf_from_a_database_that_was_deleted"
    assert (home.root / "api_token").read_text().strip() == token
