"""What a hook call gets (engine/plugins/permissions.py, engine/invoke.py hook_call_for): a manifest's asks beyond the
defaults only for an approved version, never above the operator's ceilings, and never the service's own variables."""

from __future__ import annotations

import pytest

from engine.config import Limits, PluginEnv, ServiceConfig
from engine.invoke import hook_call_for
from engine.overrides import Overrides
from engine.plugins.catalog import Catalog
from engine.plugins.manifest import parse_manifest_text
from engine.plugins.permissions import PermissionPolicy, Request, changes, covered, requested, service_own
from tests.engine.helpers import approve
from tests.plugin_factory import make_plugin

ECHO = "import sys; sys.stdin.read(); print('{}')\n"


def manifest(text: str):
    return parse_manifest_text('name = "p"\n' + text)[0]


def call_of(ehome, name, policy, hook="ingest", **kw):
    return hook_call_for(Catalog(ehome).get(name), hook, {"agent_id": "a", "message": "m"}, ehome, policy=policy, **kw)


def test_it_lists_what_a_manifest_asks_beyond_the_defaults():
    assert requested(manifest("[hooks]\nhook_timeout_secs = 10\nmax_processes = 20\nallow_filesystem = true\n")).empty
    asked = requested(manifest('allowed_secrets = ["k"]\n[env]\nA = "${SVC_URL}"\nB = "plain"\n'
                               '[wasm]\ncapabilities = ["host:az_env_get"]\n[hooks]\nallow_network = true\n'
                               'max_processes = 2000\nmax_memory_mb = 4096\nhook_timeout_secs = 300\n'
                               'allowed_env_vars = ["LANGUAGE"]\n'))
    assert asked == Request(network=True, env_vars=("LANGUAGE", "SVC_URL"), secrets=("k",),
                            wasm_capabilities=("host:az_env_get",), max_processes=2000, max_memory_mb=4096,
                            hook_timeout_secs=300)
    assert Request.from_dict(asked.to_dict()) == asked
    assert [a["key"] for a in asked.asks()] == ["network", "env:LANGUAGE", "env:SVC_URL", "secret:k",
                                                "wasm:host:az_env_get", "max_processes", "max_memory_mb",
                                                "hook_timeout_secs"]


def test_an_update_is_covered_only_when_it_asks_nothing_new():
    approved = Request(network=True, env_vars=("A",), max_processes=200)
    assert covered(Request(env_vars=("A",), max_processes=150), approved)
    assert not covered(Request(env_vars=("A", "B")), approved)
    assert not covered(Request(max_processes=201), approved)
    assert not covered(Request(secrets=("s",)), approved)
    diff = changes(approved, Request(env_vars=("A", "B"), max_processes=300))
    assert [a["key"] for a in diff["added"]] == ["env:B", "max_processes"]
    assert [a["key"] for a in diff["removed"]] == ["network", "max_processes"]


def test_a_plugin_that_asks_nothing_just_works_without_approval(ehome):
    make_plugin(ehome.plugins_dir, "plain", {"ingest": ECHO}, toml_extra="max_processes = 16")
    call = call_of(ehome, "plain", PermissionPolicy())
    assert (call.allow_network, call.max_processes, call.timeout_secs) == (False, 16, 30)


def test_an_edit_on_disk_is_not_trusted_beyond_the_defaults_until_approved(ehome, approvals):
    pdir = make_plugin(ehome.plugins_dir, "netty", {"ingest": ECHO, "bootstrap": ECHO})
    policy = PermissionPolicy(approvals)
    approve(approvals, pdir)  # the version an owner saw: asks nothing
    manifest_file = pdir / "plugin.toml"
    manifest_file.write_text(manifest_file.read_text() + "allow_network = true\nhook_timeout_secs = 90\n")
    warnings: list[str] = []
    call = call_of(ehome, "netty", policy, warnings=warnings)  # no reload: the catalog sees the edit at once
    assert (call.allow_network, call.timeout_secs) == (False, 30)
    assert warnings[0].startswith("permissions.unapproved: this version of netty's plugin.toml is not approved")
    assert call_of(ehome, "netty", policy, hook="bootstrap").timeout_secs == 60  # twice the default, not 180
    approve(approvals, pdir)
    call = call_of(ehome, "netty", policy)
    assert (call.allow_network, call.timeout_secs) == (True, 90)


def test_a_bootstrap_reply_cannot_grant_the_network(ehome, approvals):
    make_plugin(ehome.plugins_dir, "boot", {"ingest": ECHO})
    warnings: list[str] = []
    call = call_of(ehome, "boot", PermissionPolicy(approvals), overrides=Overrides(allow_network=True),
                   warnings=warnings)
    assert call.allow_network is False and "allow_network = true is ignored" in warnings[-1]


def test_ceilings_bound_every_limit_whatever_was_approved(ehome, approvals):
    pdir = make_plugin(ehome.plugins_dir, "greedy", {"ingest": ECHO, "bootstrap": ECHO},
                       toml_extra="max_processes = 2000\nmax_memory_mb = 99999\nhook_timeout_secs = 3000")
    approve(approvals, pdir)
    warnings: list[str] = []
    call = call_of(ehome, "greedy", PermissionPolicy(approvals), warnings=warnings)
    assert (call.max_processes, call.max_memory_mb, call.timeout_secs) == (256, 2048, 120)
    assert call_of(ehome, "greedy", PermissionPolicy(approvals), hook="bootstrap").timeout_secs == 120
    assert sum(w.startswith("permissions.ceiling") for w in warnings) == 3
    tight = PermissionPolicy(approvals, Limits(max_processes=10, max_memory_mb=64, hook_timeout_secs=5,
                                               max_cpu_secs=3))
    call = call_of(ehome, "greedy", tight)
    assert (call.max_processes, call.max_memory_mb, call.timeout_secs, call.max_cpu_secs) == (10, 64, 5, 3)
    unapproved = call_of(ehome, "greedy", PermissionPolicy())
    assert (unapproved.max_processes, unapproved.max_memory_mb, unapproved.timeout_secs) == (128, 1024, 30)


@pytest.mark.parametrize("var", ["REDIS_URL", "DATABASE_URL", "LIBREFANG_LLM_API_KEY", "LIBREFANG_HOME",
                                 "OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "DJANGO_SETTINGS_MODULE"])
def test_the_services_own_variables_never_reach_a_hook(ehome, approvals, monkeypatch, var):
    monkeypatch.setenv(var, "service-secret")
    assert service_own(var)
    pdir = make_plugin(ehome.plugins_dir, "leaky", {"ingest": ECHO}, top_extra=f'[env]\nA = "${{{var}}}"',
                       toml_extra=f'allowed_env_vars = ["{var}"]')
    approve(approvals, pdir)
    policy = PermissionPolicy.of(ServiceConfig(plugin_env=PluginEnv(allow=[var])), approvals)
    call = call_of(ehome, "leaky", policy, allowed_env_vars=(var,))  # the operator listed it too
    assert call.plugin_env == {"A": ""} and var not in call.allowed_env_vars


def test_env_expands_only_approved_and_allowlisted_variables(ehome, approvals, monkeypatch):
    monkeypatch.setenv("WEATHER_URL", "http://weather")
    monkeypatch.setenv("OTHER_URL", "http://other")
    pdir = make_plugin(ehome.plugins_dir, "envy", {"ingest": ECHO},
                       top_extra='[env]\nW = "${WEATHER_URL}"\nO = "${OTHER_URL}"\nP = "plain"',
                       toml_extra='allowed_env_vars = ["WEATHER_URL", "OTHER_URL"]')
    cfg = ServiceConfig(plugin_env=PluginEnv(allow=["WEATHER_URL"]))
    policy = PermissionPolicy.of(cfg, approvals)
    call = call_of(ehome, "envy", policy)
    assert call.plugin_env == {"W": "", "O": "", "P": "plain"} and call.allowed_env_vars == ()
    approve(approvals, pdir)
    warnings: list[str] = []
    call = call_of(ehome, "envy", policy, warnings=warnings)
    assert call.plugin_env == {"W": "http://weather", "O": "", "P": "plain"}
    assert call.allowed_env_vars == ("WEATHER_URL",)
    assert "permissions.env_not_allowed: OTHER_URL is not in [plugin_env] allow of config.toml" in warnings


def test_a_restored_last_good_manifest_is_approved_only_for_its_own_text(ehome, approvals):
    pdir = make_plugin(ehome.plugins_dir, "stale", {"ingest": ECHO})
    catalog = Catalog(ehome)
    catalog.get("stale")  # loads, and keeps a last good copy in the data dir (where a hook can write)
    catalog.last_good_path("stale").write_text((pdir / "plugin.toml").read_text() + "allow_network = true\n")
    (pdir / "plugin.toml").write_text("not = [toml")
    approve(approvals, ehome.plugins_dir / "stale")  # approves the broken text, nothing else
    entry = Catalog(ehome).get("stale")
    assert entry.plugin is not None and entry.plugin.manifest.hooks.allow_network
    call = hook_call_for(entry, "ingest", {"agent_id": "a", "message": "m"}, ehome, policy=PermissionPolicy(approvals))
    assert call.allow_network is False
