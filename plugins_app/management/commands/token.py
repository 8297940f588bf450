"""`librefang token create --role <owner|admin|viewer|agent> --name <n> [--agent ID …]` | `token list` |
`token revoke <id|name>`. `--agent` (repeatable; a trailing `*` for a prefix) binds an agent token to those agents.

`create` prints the raw token exactly once, alone on the last line of output (`TOKEN=$(librefang token create …
| tail -n1)`). Exit codes: 0 ok, 2 bad input, 3 no such token.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from plugins_app.models import ApiToken, Role
from plugins_app.services.tokens import create_token, describe, revoke_token


class Command(BaseCommand):
    help = "Create, list and revoke API bearer tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token; prints it once, alone on the last line")
        create.add_argument("--role", required=True, choices=Role.values)
        create.add_argument("--name", required=True)
        create.add_argument("--agent", action="append", default=[], metavar="ID",
                            help="bind an agent token to this agent id (repeatable; a trailing * for a prefix)")
        lst = sub.add_parser("list", help="list tokens (never the tokens themselves)")
        lst.add_argument("--json", action="store_true")
        lst.add_argument("--all", action="store_true", help="include revoked tokens")
        revoke = sub.add_parser("revoke", help="revoke a token by id or name")
        revoke.add_argument("token", help="id, name or prefix of the token")

    def handle(self, *args, action: str, **opts):
        return getattr(self, f"_{action}")(**opts) or None

    def _create(self, role: str, name: str, agent: list[str], **_):
        try:
            token, raw = create_token(name, role, actor="cli", agent_ids=agent)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        bound = f" for agents {', '.join(token.agent_ids)}" if token.agent_ids else ""
        self.stderr.write(f"Created {role} token #{token.pk} {token.name!r}{bound}. It is shown once; store it now:")
        self.stdout.write(raw)

    def _list(self, json: bool = False, all: bool = False, **_):  # noqa: A002
        qs = ApiToken.objects.all() if all else ApiToken.objects.filter(revoked_at__isnull=True)
        rows = [describe(t) for t in qs]
        if json:
            import json as _json

            self.stdout.write(_json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no tokens")
            return
        self.stdout.write(f"{'ID':>4}  {'ROLE':<7} {'PREFIX':<12} {'STATE':<8} {'LAST USED':<20} {'AGENTS':<20} NAME")
        for r in rows:
            agents = "-" if r["agent_ids"] is None else ",".join(r["agent_ids"]) or "all agents"
            self.stdout.write(f"{r['id']:>4}  {r['role']:<7} {r['prefix']:<12} {'active' if r['active'] else 'revoked':<8} "
                              f"{(r['last_used_at'] or '-')[:19]:<20} {agents:<20} {r['name']}")

    def _revoke(self, token: str, **_):
        qs = ApiToken.objects.filter(pk=int(token)) if token.isdigit() else (
            ApiToken.objects.filter(name=token) | ApiToken.objects.filter(prefix=token))
        found = list(qs.filter(revoked_at__isnull=True)) or list(qs)
        if not found:
            raise CommandError(f"no token {token!r}", returncode=3)
        if len(found) > 1:
            raise CommandError(f"{token!r} matches {len(found)} tokens; revoke by id "
                               f"({', '.join(str(t.pk) for t in found)})", returncode=2)
        t = revoke_token(found[0].pk, actor="cli")
        self.stdout.write(f"revoked token #{t.pk} {t.name!r} ({t.role})")

