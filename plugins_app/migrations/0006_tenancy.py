"""Agents are tenants: tokens bound to agent ids; memories with a session scope, a key unique within their scope,
metadata, an update time and an optional expiry."""

from importlib import import_module

from django.db import migrations, models
from django.db.models import F


def updated_when_created(apps, schema_editor):
    """Rows from before this migration were last changed when they were made."""
    apps.get_model("plugins_app", "Memory").objects.update(updated_at=F("created_at"))


def full_text_again(apps, schema_editor):
    """SQLite rebuilds the memory table to add these columns, which drops its full-text triggers: make them (and
    the index) again, as migration 0002 does."""
    if schema_editor.connection.vendor == "sqlite":
        for sql in import_module("plugins_app.migrations.0002_memory_fulltext").SQLITE_FORWARD:
            schema_editor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('plugins_app', '0005_plugin_bundles'),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='agent_ids',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='memory',
            name='expires_at',
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.AddField(
            model_name='memory',
            name='key',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='memory',
            name='metadata',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='memory',
            name='session_id',
            field=models.CharField(blank=True, db_index=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='memory',
            name='updated_at',
            field=models.DateTimeField(auto_now=True),
        ),
        migrations.AddConstraint(
            model_name='memory',
            constraint=models.UniqueConstraint(condition=models.Q(('key', ''), _negated=True), fields=('agent_id', 'peer_id', 'session_id', 'key'), name='uniq_memory_key_in_scope'),
        ),
        migrations.RunPython(updated_when_created, migrations.RunPython.noop),
        migrations.RunPython(full_text_again, migrations.RunPython.noop),
    ]
