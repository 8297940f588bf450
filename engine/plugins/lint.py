"""Lint one plugin directory: errors make it unusable, warnings are advice (LibreFang's lint and `hooks_valid` checks, plus unknown keys)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import findings as F
from engine.findings import Finding
from engine.hooks import ALL_HOOKS
from engine.plugins.loader import load_plugin
from engine.plugins.manifest import ManifestError
from engine.process.runner import resolve_script
from engine.process.runtimes import RUNTIMES, find_launcher
from engine.wasm import WasmPolicy, check_plugin

DISABLED_MARKER = ".disabled"
_EXT_RUNTIME = {r.extension: r.tag for r in RUNTIMES.values() if r.extension and r.tag not in ("bun",)}


@dataclass
class LintReport:
    plugin: str
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def findings(self) -> list[Finding]:
        return [*self.errors, *self.warnings]

    def to_dict(self) -> dict:
        return {"plugin": self.plugin, "ok": self.ok, "errors": [f.to_dict() for f in self.errors],
                "warnings": [f.to_dict() for f in self.warnings]}


def hooks_valid(plugin_dir: Path, scripts: dict[str, str]) -> bool:
    for script in scripts.values():
        try:
            resolve_script(plugin_dir, script)
        except (ValueError, FileNotFoundError, OSError):
            return False
    return True


def add_sandbox_findings(add) -> None:
    """`sandbox.degraded`: subprocess hooks here get less than their whole sandbox (engine/process/sandbox.py: no
    namespaces, no host uid of their own, or no seccomp filter). Probed once per process."""
    from engine.process.sandbox import degraded_reasons

    reasons = degraded_reasons()
    if reasons:
        add(F.warning("sandbox.degraded", "hooks run with less than their whole sandbox: " + "; ".join(reasons),
                      "Run the service as root with libseccomp installed (or at least allow unprivileged user "
                      "namespaces: user.max_user_namespaces > 0); see docs/security.md."))


def lint_plugin(plugin_dir: Path, installed: set[str] | None = None, wasm_policy: Any = None) -> LintReport:
    """`wasm_policy`: the service's engine.wasm.WasmPolicy for a wasm plugin's imports (None: the defaults)."""
    report = LintReport(plugin_dir.name)

    def add(f: Finding) -> None:
        (report.errors if f.severity == F.ERROR else report.warnings).append(f)

    try:
        loaded = load_plugin(plugin_dir)
    except ManifestError as exc:
        for f in exc.findings:
            add(f)
        return report
    for f in loaded.findings:
        add(f)
    m = loaded.manifest
    resolved = m.runtime
    declared = m.hooks.declared_hooks()
    for hook, script in declared.items():
        try:
            path = resolve_script(plugin_dir, script)
        except ValueError as exc:
            add(F.error("hook.path_traversal", f"{hook}: {exc}", "Keep hook files inside the plugin directory."))
            continue
        except FileNotFoundError:
            add(F.error("hook.missing", f"{hook}: file {script!r} does not exist",
                        f"Create {script} or remove `{hook}` from [hooks]."))
            continue
        if resolved.runtime.needs_exec_bit and not resolved.custom_launcher and not os.access(path, os.X_OK):
            add(F.error("hook.not_executable", f"{hook}: {script} is not executable (runtime native)",
                        f"chmod +x {script}"))
        ext = path.suffix.lstrip(".")
        expected = _EXT_RUNTIME.get(ext)
        tag = resolved.runtime.tag
        if expected and not resolved.custom_launcher and expected != tag and not (ext == "ts" and tag == "bun"):
            add(F.warning("hook.extension_mismatch", f"{hook}: {script} looks like {expected} but the runtime is {tag}",
                          "Set `runtime` inside [hooks] to the language the hooks are written in."))
        if m.integrity and script not in m.integrity:
            add(F.warning("integrity.hook_unsigned", f"{hook}: {script} has no [integrity] entry",
                          "Add its sha256 to [integrity] so tampering is detected."))
    if resolved.runtime.is_wasm:  # ABI, imports, memory (engine/wasm/)
        for f in check_plugin(plugin_dir, declared, wasm_policy or WasmPolicy(), m.wasm_capabilities):
            if f.id not in ("wasm.module_missing", "wasm.module_path"):  # reported above
                add(f)
    if not declared:
        add(F.warning("hooks.none", "no hooks are declared", f"Declare at least one of: {', '.join(ALL_HOOKS)}."))
    if not m.description:
        add(F.warning("manifest.no_description", "no description", "Add `description = \"…\"`."))
    if not m.author:
        add(F.warning("manifest.no_author", "no author", "Add `author = \"…\"`."))
    if not m.version:
        add(F.warning("manifest.no_version", "empty version", "Add `version = \"0.1.0\"`."))
    if resolved.runtime.launcher and not resolved.custom_launcher and find_launcher(resolved.runtime.tag) is None:
        # an error: every hook call would fail with launcher_not_found, so the plugin is enabled but cannot run
        add(F.error("runtime.unavailable", f"launcher {resolved.runtime.launcher!r} is not installed: no hook can "
                    f"run", resolved.runtime.install_hint))
    if not resolved.runtime.is_wasm:  # a wasm hook runs in the worker, not in the process sandbox
        add_sandbox_findings(add)
    for dep in m.plugin_depends:
        if installed is not None and dep not in installed:
            add(F.warning("depends.missing", f"plugin_depends: {dep!r} is not installed",
                          f"Install {dep} first."))
    if (plugin_dir / DISABLED_MARKER).exists():
        add(F.warning("plugin.disabled", "the plugin is disabled", "Enable it to use it."))
    if m.requirements and not (plugin_dir / m.requirements).is_file():
        add(F.warning("requirements.missing", f"requirements file {m.requirements!r} does not exist",
                      "Create it or remove `requirements`."))
    import shutil

    for req in m.requires:
        if shutil.which(req.binary) is None:
            add(F.warning("requires.missing_binary", f"required binary {req.binary!r} is not on PATH",
                          req.install_hint or f"Install {req.binary}."))
    return report
