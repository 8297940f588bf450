"""A problem found in a plugin: stable id, severity, message and a hint. Used by lint, doctor and the API."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    message: str
    hint: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def error(id: str, message: str, hint: str = "") -> Finding:
    return Finding(id, ERROR, message, hint)


def warning(id: str, message: str, hint: str = "") -> Finding:
    return Finding(id, WARNING, message, hint)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == ERROR for f in findings)


# The stable ids the engine itself emits (engine/plugins/manifest.py, engine/plugins/catalog.py), with what each means. Lint and
# doctor (engine/plugins/lint.py, engine/plugins/doctor.py) add their own ids on top. Ids never change meaning once published.
ENGINE_FINDINGS: dict[str, str] = {
    "manifest.missing": "error: the plugin directory has no plugin.toml",
    "manifest.unreadable": "error: plugin.toml cannot be read or is not UTF-8",
    "manifest.toml_syntax": "error: plugin.toml is not valid TOML",
    "manifest.hooks_not_table": "error: [hooks] is not a table",
    "manifest.invalid_field": "error: a field has the wrong type or is out of range (e.g. hook_timeout_secs <= 0)",
    "manifest.name_invalid": "error: name is not 1-128 ASCII letters/digits/'-'/'_'",
    "manifest.name_mismatch": "error: name differs from the directory name",
    "manifest.min_version_invalid": "error: librefang_min_version is not a version",
    "manifest.min_version_unmet": "error: librefang_min_version is newer than COMPAT_VERSION (engine/plugins/manifest.py)",
    "manifest.hook_path_traversal": "error: a hook path is absolute or contains '..'",
    "manifest.hook_path_escape": "error: a hook path resolves (symlink) outside the plugin directory",
    "manifest.depends_missing": "error: a plugin named in plugin_depends is not installed",
    "integrity.mismatch": "error: a file's sha256 differs from [integrity]",
    "integrity.unreadable": "error: a file named in [integrity] cannot be read",
    "integrity.path_invalid": "error: an [integrity] path leaves the plugin directory",
    "manifest.hooks_conflict": "warning: a key is set in [hooks] and at the top level/[context_engine_hooks]",
    "manifest.unknown_key": "warning: unknown top-level key (ignored)",
    "manifest.unknown_hook_key": "warning: unknown [hooks] key (ignored)",
    "manifest.runtime_unknown": "error: unknown runtime tag; the plugin cannot run",
    "manifest.protocol_newer": "warning: hook_protocol_version is newer than this engine's",
    "manifest.ingest_regex_invalid": "warning: ingest_regex does not compile; it is ignored",
    "manifest.needs_unknown": "warning: a `needs` entry is neither a capability nor a plugin name",
    "manifest.env_unset": "warning: an [env] value ${VAR} names a variable the service does not have",
    "manifest.env_required_missing": "warning: env_schema marks a variable required ('!') but it is not set",
    "manifest.config_default_type": "warning: a [config] default does not match its declared type",
    "manifest.stale": "warning: plugin.toml on disk is invalid; the previous configuration keeps serving",
}
