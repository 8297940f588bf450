"""First-run setup: the admin user and an owner API token, and how to log in.

Secrets are printed once, by the run that creates them; later runs print where they are kept. A kept token is
checked against the token table first: a revoked one is never printed or offered as a sample.
"""

from __future__ import annotations

import os
import secrets
import shlex

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from plugins_app.auth import hash_token
from plugins_app.models import ApiToken
from plugins_app.services.tokens import create_token

FIRST_TOKEN_NAME = "first-run owner token"
# An authenticated route (any role but agent can read it), so the sample proves the token works.
SAMPLE_PATH = "api/context-engine/metrics"


class Command(BaseCommand):
    help = "First-run setup: admin user with a generated password and an owner API token."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:4545/")

    def handle(self, *args, url: str, **options):
        home = settings.LIBREFANG_HOME
        home.mkdir(parents=True, exist_ok=True)
        (home / "plugins").mkdir(exist_ok=True)
        password_file, token_file = home / "admin_password", home / "api_token"
        url = url if url.endswith("/") else url + "/"
        lines = [f"  Dashboard:  {url}"]
        lines += self._admin(password_file)
        lines += self._token(token_file, url)
        self.stdout.write("\n" + "\n".join(lines) + "\n")

    def _admin(self, password_file) -> list[str]:
        User = get_user_model()
        admin = User.objects.filter(is_superuser=True).order_by("pk").first()
        if admin is None:
            password = secrets.token_urlsafe(12)
            admin = User.objects.create_superuser("admin", "", password)
            _write_secret(password_file, password)
            return [f"  Username:   {admin.username}",
                    f"  Password:   {password}    (shown once; saved in {password_file}, mode 0600)"]
        lines = [f"  Username:   {admin.username}"]
        kept = password_file.read_text().strip() if password_file.exists() else ""
        if kept and admin.check_password(kept):
            lines.append(f"  Password:   in {password_file}")
        elif kept:
            lines.append(f"  Password:   changed since first run ({password_file} is out of date); "
                         f"reset it with `librefang changepassword {admin.username}`")
        else:
            lines.append(f"  Password:   not kept on disk; reset it with `librefang changepassword {admin.username}`")
        return lines

    def _token(self, token_file, url: str) -> list[str]:
        kept = token_file.read_text().strip() if token_file.exists() else ""
        row = ApiToken.objects.filter(token_hash=hash_token(kept)).first() if kept else None
        if row is None:  # first run, or a token file left from another database
            _token, raw = create_token(FIRST_TOKEN_NAME, "owner", actor="firstrun")
            _write_secret(token_file, raw)
            return [f"  API token:  {raw}",
                    f"              (owner role; shown once; saved in {token_file}, mode 0600)",
                    f"  Try:        curl -H 'Authorization: Bearer {raw}' {url}{SAMPLE_PATH}"]
        if row.revoked_at is not None:
            return [f"  API token:  the first-run owner token ({token_file}) was revoked on "
                    f"{row.revoked_at:%Y-%m-%d %H:%M} UTC; create a new one with",
                    "              `librefang token create --role owner --name <name>` (printed once)"]
        return [f"  API token:  owner token in {token_file}",
                f'  Try:        curl -H "Authorization: Bearer $(cat {shlex.quote(str(token_file))})" {url}{SAMPLE_PATH}']


def _write_secret(path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.chmod(path, 0o600)
