"""`librefang memory reembed [--batch-size N] [--agent ID]`: give every memory a vector of the configured
`[embeddings]` model, in batches, printing progress. Resumable: stopped or failed, run it again and it takes only
the memories still missing a vector of that model (plugins_app/services/vectors.py). Exit codes: 0 ok, 1 the
embedder failed (what was done stays done), 2 bad input.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from engine.embeddings import EmbeddingError
from plugins_app.home import required_embedder
from plugins_app.services.vectors import reembed


class Command(BaseCommand):
    help = "Memory store maintenance: re-embed memories after an [embeddings] model or dimension change."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        re = sub.add_parser("reembed", help="embed every memory lacking a vector of the configured model")
        re.add_argument("--batch-size", type=int, default=64)
        re.add_argument("--agent", default=None, help="only this agent's memories")

    def handle(self, *args, action: str, batch_size: int, agent: str | None, **_):
        if batch_size <= 0:
            raise CommandError("--batch-size must be positive", returncode=2)
        try:
            emb = required_embedder()
            self.stdout.write(f"re-embedding with {emb.model} ({emb.dimensions} dimensions)")
            done = reembed(batch_size, agent, progress=lambda n, total: self.stdout.write(f"  {n}/{total}"))
        except EmbeddingError as exc:
            raise CommandError(f"embedding failed, run again to resume: {exc}", returncode=1) from exc
        self.stdout.write("nothing to re-embed" if done == 0 else f"re-embedded {done} memories")
