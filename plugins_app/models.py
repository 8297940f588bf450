"""Durable state: tokens, audit, per-plugin metrics, traces, the built-in memory store and job outcomes."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner (runs or changes plugin code)"
    ADMIN = "admin", "Admin (enable/disable/uninstall/config)"
    VIEWER = "viewer", "Viewer (read only)"
    AGENT = "agent", "Agent (context-engine hook calls)"


class ApiToken(models.Model):
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=10, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)  # sha256 hex; the token itself is never stored
    prefix = models.CharField(max_length=12)  # shown in lists so operators can tell tokens apart
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # An agent token bound to agents: the agent ids (a trailing "*" is a prefix) it may act for; empty: every agent
    # (plugins_app/auth.py `may_act_for`).
    agent_ids = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.role})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class AuditEntry(models.Model):
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)  # "user:<name>" or "token:<name>" or "cli"
    action = models.CharField(max_length=50)
    target = models.CharField(max_length=200, blank=True)
    ok = models.BooleanField(default=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]


class HookMetric(models.Model):
    """Totals per plugin and hook since the last reset (the docs' shape plus extras)."""

    plugin = models.CharField(max_length=128)
    hook = models.CharField(max_length=32)
    calls = models.BigIntegerField(default=0)
    successes = models.BigIntegerField(default=0)
    failures = models.BigIntegerField(default=0)
    latency_ms_total = models.FloatField(default=0)  # failed calls' latency included (LibreFang records 0)
    # Agent traffic's latency sketch (engine/quantiles.py): {"s<k>": count}, merged across rows for percentiles.
    histogram = models.JSONField(default=dict)
    # Test-console runs, kept apart: they are not agent traffic and must not move Calls/Errors or percentiles.
    console_calls = models.BigIntegerField(default=0)
    console_failures = models.BigIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_error_kind = models.CharField(max_length=40, blank=True)
    last_called_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plugin", "hook"], name="uniq_metric_plugin_hook")]
        ordering = ["plugin", "hook"]


class _MetricPeriod(models.Model):
    """The figures kept per plugin × hook × period (a minute or an hour)."""

    plugin = models.CharField(max_length=128)
    hook = models.CharField(max_length=32)
    calls = models.IntegerField(default=0)
    failures = models.IntegerField(default=0)
    latency_ms_total = models.FloatField(default=0)
    histogram = models.JSONField(default=dict)  # latency sketch, see engine/quantiles.py
    console_calls = models.IntegerField(default=0)
    console_failures = models.IntegerField(default=0)

    class Meta:
        abstract = True


class HookMetricBucket(_MetricPeriod):
    """Per-minute agent-traffic counts and latency sketch: charts and percentiles over any time range."""

    minute = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plugin", "hook", "minute"], name="uniq_bucket")]
        indexes = [models.Index(fields=["minute"])]


class HookMetricHour(_MetricPeriod):
    """The same figures per hour: long chart ranges (7 days) read 60× fewer rows than from the minute buckets."""

    hour = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plugin", "hook", "hour"], name="uniq_hour_bucket")]
        indexes = [models.Index(fields=["hour"])]


class HookTrace(models.Model):
    trace_id = models.CharField(max_length=16, unique=True)
    job_id = models.CharField(max_length=64, blank=True, db_index=True)
    plugin = models.CharField(max_length=128)
    hook = models.CharField(max_length=32)
    agent_id = models.CharField(max_length=200, blank=True, db_index=True)
    started_at = models.DateTimeField(db_index=True)
    elapsed_ms = models.FloatField()
    ok = models.BooleanField()
    error_kind = models.CharField(max_length=40, blank=True)
    error = models.TextField(blank=True)
    input_preview = models.TextField(blank=True)
    output_preview = models.TextField(blank=True)
    stderr_tail = models.TextField(blank=True)
    annotations = models.JSONField(null=True, blank=True)
    origin = models.CharField(max_length=20, default="agent", db_index=True)  # "agent" | "test_console"

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["plugin", "hook"])]


class Memory(models.Model):
    """The default engine's memory store, scoped by agent, peer and session ("" = none); a `key` names a memory
    within its scope (put-by-key replaces it)."""

    agent_id = models.CharField(max_length=200, db_index=True)
    peer_id = models.CharField(max_length=200, blank=True, db_index=True)
    session_id = models.CharField(max_length=200, blank=True, default="", db_index=True)
    key = models.CharField(max_length=200, blank=True, default="")
    content = models.TextField()
    scope = models.CharField(max_length=200, default="hook")
    tags = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=128, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["agent_id", "peer_id", "session_id", "key"],
                                               condition=~models.Q(key=""), name="uniq_memory_key_in_scope")]


class MemoryVector(models.Model):
    """A memory's embedding (float32, unit length) and the model that made it: recall compares only vectors of the
    configured model, so a model or dimension change never mixes two (`librefang memory reembed` re-embeds)."""

    memory = models.OneToOneField(Memory, on_delete=models.CASCADE, primary_key=True, related_name="vector")
    model = models.CharField(max_length=200, db_index=True)
    dimensions = models.IntegerField()
    embedding = models.BinaryField()
    embedded_at = models.DateTimeField(auto_now=True)

class JobRecord(models.Model):
    """The stored outcome of a bus job; the worker XACKs only after this row is written."""

    class State(models.TextChoices):
        DONE = "done"
        EXPIRED = "expired"  # deadline passed before a worker picked it up
        FAILED = "failed"

    job_id = models.CharField(max_length=64, unique=True)
    hook = models.CharField(max_length=32)
    state = models.CharField(max_length=10, choices=State.choices)
    source = models.CharField(max_length=300, blank=True)
    fallback_reason = models.TextField(blank=True)
    deliveries = models.IntegerField(default=1)
    worker = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(auto_now=True)


class IdempotentResponse(models.Model):
    key = models.CharField(max_length=200, unique=True)
    body_sha256 = models.CharField(max_length=64)
    status = models.IntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)


class PluginBundle(models.Model):
    """One plugin version, content-addressed (engine/plugins/bundles.py): what any worker host runs for that hash."""

    hash = models.CharField(max_length=64, primary_key=True)
    plugin = models.CharField(max_length=128, db_index=True)
    archive = models.BinaryField()  # gzip tarball of the plugin directory's files
    manifest = models.JSONField(default=dict)  # the parsed plugin.toml, for display without unpacking
    size = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)


class ActivePlugin(models.Model):
    """Which bundle serves a plugin now, cluster-wide. Jobs pin `bundle_hash` when they are queued."""

    name = models.CharField(max_length=128, primary_key=True)
    bundle_hash = models.CharField(max_length=64)
    enabled = models.BooleanField(default=True)
    retired = models.BooleanField(default=False)  # uninstalled: runs nowhere
    updated_at = models.DateTimeField(auto_now=True)


class EngineSetting(models.Model):
    """The context-engine configuration shared by every host: config.toml's text as it last parsed (the web tier
    copies it here at start and whenever the file changes)."""

    key = models.CharField(max_length=40, primary_key=True)
    text = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class PluginApproval(models.Model):
    """An owner's approval of one plugin.toml version (engine/plugins/permissions.py): that version of that plugin
    gets what it asks beyond the defaults, within the operator's ceilings. Any other version runs with the defaults.
    Kept here, where no hook can write, and read by every worker."""

    plugin = models.CharField(max_length=128, db_index=True)
    manifest_sha256 = models.CharField(max_length=64)
    permissions = models.JSONField(default=dict)  # what that version asks (permissions.Request.to_dict())
    manifest = models.TextField(blank=True)  # its plugin.toml, to show what a later version changed
    approved_by = models.CharField(max_length=150)  # the audit actor
    how = models.CharField(max_length=20, default="approve")  # approve | scaffold | install | edit | reload | update
    approved_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["plugin", "manifest_sha256"], name="uniq_plugin_approval")]
        ordering = ["-approved_at", "-id"]


class AlertState(models.Model):
    """Each alert's current state (plugins_app/services/alerts.py), shared by every web process: the process whose
    update flips it is the one that sends the message, so several processes never send it twice."""

    key = models.CharField(max_length=200, unique=True)  # "plugin_failing:<plugin>:<hook>", "queue_lag", …
    rule = models.CharField(max_length=40)
    firing = models.BooleanField(default=False)
    value = models.FloatField(null=True, blank=True)  # the figure measured last (queue lag, live workers, …)
    summary = models.TextField(blank=True)
    since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class AlertEvent(models.Model):
    """An alert that fired or resolved (or a test message), and what each webhook answered: the alert history."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    key = models.CharField(max_length=200)
    rule = models.CharField(max_length=40)
    status = models.CharField(max_length=10)  # "firing" | "resolved" | "test"
    summary = models.TextField()
    deliveries = models.JSONField(default=list)  # [{"url", "format", "ok", "status" | "error"}]

    class Meta:
        ordering = ["-at"]
