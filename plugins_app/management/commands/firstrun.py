"""Create the admin user and an owner API token on first run, and print how to log in."""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from plugins_app.services.tokens import create_token


class Command(BaseCommand):
    help = "First-run setup: admin user with a generated password and an owner API token."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:4545/")

    def handle(self, *args, url: str, **options):
        home = settings.LIBREFANG_HOME
        home.mkdir(parents=True, exist_ok=True)
        (home / "plugins").mkdir(exist_ok=True)
        User = get_user_model()
        password_file = home / "admin_password"
        token_file = home / "api_token"
        if not User.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "", password)
            _write_secret(password_file, password)
        if not token_file.exists():
            _token, raw = create_token("first-run owner token", "owner", actor="firstrun")
            _write_secret(token_file, raw)
        password = password_file.read_text().strip() if password_file.exists() else "(set by you)"
        token = token_file.read_text().strip()
        self.stdout.write(
            "\n"
            f"  Dashboard:  {url}\n"
            f"  Username:   admin\n"
            f"  Password:   {password}    (also in {password_file})\n"
            f"  API token:  {token}\n"
            f"              (owner role; saved in {token_file}, mode 0600)\n"
            f"  Try:        curl -H 'Authorization: Bearer {token}' {url}api/health\n"
        )


def _write_secret(path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.chmod(path, 0o600)
