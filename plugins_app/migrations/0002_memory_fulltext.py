"""Full-text search for the default engine's memory store, per database vendor.

SQLite: an FTS5 external-content table over plugins_app_memory, kept in sync by triggers (porter stemming).
PostgreSQL: a GIN index on to_tsvector('english', content); recall queries use the same expression.
Other vendors: nothing (recall falls back to a LIKE scan).
"""

from django.db import migrations

SQLITE_FORWARD = [
    """CREATE VIRTUAL TABLE IF NOT EXISTS plugins_app_memory_fts USING fts5(
        content, content='plugins_app_memory', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2')""",
    """CREATE TRIGGER IF NOT EXISTS plugins_app_memory_fts_ai AFTER INSERT ON plugins_app_memory BEGIN
        INSERT INTO plugins_app_memory_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER IF NOT EXISTS plugins_app_memory_fts_ad AFTER DELETE ON plugins_app_memory BEGIN
        INSERT INTO plugins_app_memory_fts(plugins_app_memory_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER IF NOT EXISTS plugins_app_memory_fts_au AFTER UPDATE OF content ON plugins_app_memory BEGIN
        INSERT INTO plugins_app_memory_fts(plugins_app_memory_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO plugins_app_memory_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    "INSERT INTO plugins_app_memory_fts(plugins_app_memory_fts) VALUES ('rebuild')",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS plugins_app_memory_fts_au",
    "DROP TRIGGER IF EXISTS plugins_app_memory_fts_ad",
    "DROP TRIGGER IF EXISTS plugins_app_memory_fts_ai",
    "DROP TABLE IF EXISTS plugins_app_memory_fts",
]
PG_FORWARD = [
    "CREATE INDEX IF NOT EXISTS plugins_app_memory_fts_gin ON plugins_app_memory "
    "USING GIN (to_tsvector('english', content))",
    "CREATE INDEX IF NOT EXISTS plugins_app_memory_scope_idx ON plugins_app_memory (agent_id, peer_id)",
]
PG_BACKWARD = [
    "DROP INDEX IF EXISTS plugins_app_memory_fts_gin",
    "DROP INDEX IF EXISTS plugins_app_memory_scope_idx",
]


def _run(statements_by_vendor):
    def apply(apps, schema_editor):
        statements = statements_by_vendor.get(schema_editor.connection.vendor, [])
        for sql in statements:
            schema_editor.execute(sql)
    return apply


class Migration(migrations.Migration):
    dependencies = [("plugins_app", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_FORWARD, "postgresql": PG_FORWARD}),
            _run({"sqlite": SQLITE_BACKWARD, "postgresql": PG_BACKWARD}),
        ),
    ]
