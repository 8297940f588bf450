"""plugin.toml conformance (engine/plugins/manifest.py, docs/compatibility.md "Manifest"): every field, aliases and precedence, findings with stable
ids, [env] expansion, [integrity] on every load, min version, dependencies, [config], [i18n], requirements venv."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from engine import protocol as P
from engine.invoke import expand_env
from engine.plugins.catalog import Catalog
from engine.plugins.loader import load_plugin
from engine.plugins.manifest import COMPAT_VERSION, ManifestError, parse_manifest_text
from engine.plugins.requirements import install_requirements
from tests.engine.helpers import approve
from tests.plugin_factory import make_plugin, write_config

ECHO = """
import json, os, sys
req = json.loads(sys.stdin.read())
print(json.dumps({"memories": [{"content": "echo " + req.get("message", "")}], "env": dict(os.environ)}))
"""


def ids(findings):
    return [f.id for f in findings]


def parse(text, name="p"):
    return parse_manifest_text(text, expected_name=name)


# ---- where execution keys live ----

def test_it_reads_execution_keys_from_hooks_and_from_the_top_level():
    m, found = parse('name = "p"\nversion = "1"\nhook_timeout_secs = 7\nmax_retries = 2\nruntime = "node"\n'
                     '[hooks]\ningest = "hooks/ingest.js"\n')
    assert (m.hooks.hook_timeout_secs, m.hooks.max_retries, m.runtime.runtime.tag) == (7, 2, "node")
    assert found == []


def test_it_lets_hooks_win_over_the_top_level_with_a_warning():
    m, found = parse('name = "p"\nhook_timeout_secs = 7\n[hooks]\nhook_timeout_secs = 3\n')
    assert m.hooks.hook_timeout_secs == 3
    assert ids(found) == ["manifest.hooks_conflict"]


def test_it_accepts_context_engine_hooks_as_an_alias_of_hooks():
    m, _ = parse('name = "p"\n[context_engine_hooks]\ningest = "hooks/i.py"\nhook_timeout_secs = 4\n')
    assert m.hooks.ingest == "hooks/i.py" and m.hooks.hook_timeout_secs == 4
    m, found = parse('name = "p"\n[context_engine_hooks]\ningest = "a.py"\n[hooks]\ningest = "b.py"\n')
    assert m.hooks.ingest == "b.py" and ids(found) == ["manifest.hooks_conflict"]


def test_it_parses_the_official_mempalace_manifest_shape():
    text = """
    name = "mempalace-indexer"
    version = "0.3.0"
    description = "MemPalace"
    author = "librefang"
    librefang_min_version = "2026.4.0"
    hook_timeout_secs = 20
    on_hook_failure = "warn"
    max_retries = 1
    retry_delay_ms = 250
    persistent_subprocess = false
    hook_cache_ttl_secs = 30
    priority = 10

    [hooks]
    ingest = "hooks/ingest.py"
    after_turn = "hooks/after_turn.py"

    [[requires]]
    binary = "python3"
    install_hint = "Install Python 3"

    [config]
    min_similarity = { type = "number", default = 0.3, description = "minimum score" }
    palace = { type = "string", default = "~/.mempalace/palace" }

    [i18n.zh]
    name = "记忆宫殿"
    [i18n.de]
    description = "Gedächtnispalast"

    [integrity]
    "hooks/ingest.py" = "00"
    """
    import textwrap

    m, found = parse(textwrap.dedent(text), "mempalace-indexer")
    assert found == []
    assert (m.hooks.hook_timeout_secs, m.hooks.max_retries, m.hooks.retry_delay_ms) == (20, 1, 250)
    assert m.hooks.hook_cache_ttl_secs == 30 and m.hooks.priority == 10
    assert m.requires[0].binary == "python3" and m.config["min_similarity"].default == 0.3
    assert m.display_name("zh-TW,zh;q=0.9") == "记忆宫殿"  # exact, then base tag, then English
    assert m.display_name("de") == "mempalace-indexer"  # entry without a name falls back to the plugin name


def test_it_reports_unknown_keys_instead_of_ignoring_them_silently():
    m, found = parse('name = "p"\nvesion = "1"\n[hooks]\ningets = "x.py"\n')
    assert ids(found) == ["manifest.unknown_key", "manifest.unknown_hook_key"]
    assert "vesion" in found[0].message and found[0].hint


@pytest.mark.parametrize("text,finding", [
    ('name = "p"\n[hooks\n', "manifest.toml_syntax"),
    ('name = "bad/name"\n', "manifest.name_invalid"),
    ('name = "other"\n', "manifest.name_mismatch"),
    ('name = "p"\n[hooks]\non_hook_failure = "explode"\n', "manifest.invalid_field"),
    ('name = "p"\n[hooks]\nhook_timeout_secs = -1\n', "manifest.invalid_field"),
    ('name = "p"\nlibrefang_min_version = "9999.1.0"\n', "manifest.min_version_unmet"),
    ('name = "p"\nlibrefang_min_version = "soon"\n', "manifest.min_version_invalid"),
    ('version = "1"\n', "manifest.invalid_field"),
])
def test_it_rejects_unusable_manifests_with_a_stable_finding(text, finding):
    with pytest.raises(ManifestError) as exc:
        parse(text)
    assert finding in ids(exc.value.findings)
    assert all(f.message and f.severity in ("error", "warning") for f in exc.value.findings)


def test_it_accepts_a_min_version_at_or_below_ours():
    for version in (COMPAT_VERSION, "2026.4.0-beta1"):
        manifest, found = parse(f'name = "p"\nlibrefang_min_version = "{version}"\n')
        assert manifest.librefang_min_version == version
        assert ids(found) == [], (version, ids(found))  # no min_version finding, nor any other


def test_it_warns_about_newer_protocols_and_bad_regexes():
    _, found = parse('name = "p"\n[hooks]\nhook_protocol_version = 2\ningest_regex = "(("\n')
    assert ids(found) == ["manifest.protocol_newer", "manifest.ingest_regex_invalid"]


def test_it_refuses_an_unknown_runtime_instead_of_running_it_as_python():
    with pytest.raises(ManifestError) as exc:
        parse('name = "p"\n[hooks]\nruntime = "cobol"\n')
    assert [(f.id, f.severity) for f in exc.value.findings] == [("manifest.runtime_unknown", "error")]
    assert "'cobol'" in str(exc.value)


# ---- [env] ----

def test_it_expands_whole_value_env_references_and_warns_about_unset_ones(monkeypatch):
    monkeypatch.setenv("SVC_URL", "http://svc")
    monkeypatch.setenv("NOT_ALLOWED", "x")
    monkeypatch.delenv("NOPE_UNSET", raising=False)
    out, warnings = expand_env({"A": "${SVC_URL}", "B": "${SVC_URL}/x", "C": "${NOPE_UNSET}", "D": "plain",
                                "E": "${NOT_ALLOWED}"}, allowed={"SVC_URL", "NOPE_UNSET"})
    assert out == {"A": "http://svc", "B": "${SVC_URL}/x", "C": "", "D": "plain", "E": ""}
    assert warnings == ["[env] C = ${NOPE_UNSET}: NOPE_UNSET is not set in the service environment; passing ''"]
    _, found = parse('name = "p"\n[env]\nC = "${NOPE_UNSET}"\nN = 3\n')
    assert ids(found) == ["manifest.env_unset"]


def test_it_passes_env_to_hooks_and_records_the_unset_warning_on_the_trace(engine, ehome, sinks, monkeypatch,
                                                                          approvals):
    monkeypatch.delenv("NOPE_UNSET", raising=False)
    pdir = make_plugin(ehome.plugins_dir, "envy", {"ingest": ECHO},
                       top_extra='[env]\nGREETING = "hi"\nC = "${NOPE_UNSET}"')
    approve(approvals, pdir)
    write_config(ehome.root, plugin="envy", extra='[plugin_env]\nallow = ["NOPE_UNSET"]')
    engine.handle("ingest", {"message": "m", "agent_id": "a"})
    inv = sinks["invocations"].items[-1]
    assert inv.ok and '"GREETING": "hi"' in inv.output_preview
    assert inv.annotations == {"warnings": ["[env] C = ${NOPE_UNSET}: NOPE_UNSET is not set in the service "
                                            "environment; passing ''"]}


# ---- load-time checks ----

def test_it_refuses_hook_paths_that_leave_the_plugin_dir(ehome):
    pdir = make_plugin(ehome.plugins_dir, "trav", {}, toml_extra='ingest = "../other/x.py"')
    with pytest.raises(ManifestError) as exc:
        load_plugin(pdir)
    assert ids(exc.value.findings) == ["manifest.hook_path_traversal"]


def test_it_enforces_plugin_depends_at_load_and_on_every_use(ehome):
    make_plugin(ehome.plugins_dir, "base", {"ingest": ECHO})
    pdir = make_plugin(ehome.plugins_dir, "child", {"ingest": ECHO}, top_extra='plugin_depends = ["base"]')
    catalog = Catalog(ehome)
    assert catalog.get("child").plugin is not None
    (ehome.plugins_dir / "base" / "plugin.toml").unlink()
    entry = catalog.get("child")
    assert entry.plugin is None and ids(entry.problems) == ["manifest.depends_missing"]
    with pytest.raises(ManifestError):
        load_plugin(pdir)


def test_it_enforces_integrity_every_time_the_plugin_is_used(engine, ehome, sinks):
    pdir = make_plugin(ehome.plugins_dir, "signed", {"ingest": ECHO})
    digest = hashlib.sha256((pdir / "hooks" / "ingest.py").read_bytes()).hexdigest()
    with open(pdir / "plugin.toml", "a") as fh:
        fh.write(f'\n[integrity]\n"hooks/ingest.py" = "{digest}"\n')
    write_config(ehome.root, plugin="signed")
    assert engine.handle("ingest", {"message": "m", "agent_id": "a"}).source == "signed"
    (pdir / "hooks" / "ingest.py").write_text(ECHO + "\n# tampered\n")  # plugin.toml unchanged
    reply = engine.handle("ingest", {"message": "m", "agent_id": "a"})
    assert reply.source == "default"
    assert reply.fallback_reason.startswith("signed: integrity_failed: [integrity] sha256 of hooks/ingest.py")
    assert sinks["invocations"].items[-1].error_kind == P.INTEGRITY_FAILED


def test_it_keeps_serving_the_last_good_manifest_when_the_new_one_is_broken(engine, ehome):
    pdir = make_plugin(ehome.plugins_dir, "stale", {"ingest": ECHO})
    write_config(ehome.root, plugin="stale")
    assert engine.handle("ingest", {"message": "m", "agent_id": "a"}).source == "stale"
    (pdir / "plugin.toml").write_text((pdir / "plugin.toml").read_text() + "\n[[[broken\n")
    entry = engine.catalog.get("stale")
    assert entry.plugin is not None and "manifest.stale" in ids(entry.problems)
    assert engine.handle("ingest", {"message": "m", "agent_id": "a"}).source == "stale"


# ---- [config] ----

def test_it_writes_config_defaults_to_the_file_named_by_librefang_plugin_config(engine, ehome):
    src = """
    import json, os, sys
    sys.stdin.read()
    cfg = json.load(open(os.environ["LIBREFANG_PLUGIN_CONFIG"]))
    print(json.dumps({"memories": [{"content": json.dumps(cfg, sort_keys=True)}]}))
    """
    make_plugin(ehome.plugins_dir, "cfg", {"ingest": src},
                top_extra='[config]\nthreshold = { type = "number", default = 0.5 }\nmode = { type = "string", '
                          'default = "fast" }\nflag = { type = "boolean" }')
    write_config(ehome.root, plugin="cfg")
    reply = engine.handle("ingest", {"message": "m", "agent_id": "a"})
    assert reply.result["memories"] == [{"content": '{"flag": null, "mode": "fast", "threshold": 0.5}',
                                         "scope": "hook"}]


# ---- requirements: a per-plugin virtualenv ----

def _tiny_wheel(dest: Path) -> Path:
    wheel = dest / "tinydep-1.0-py3-none-any.whl"
    files = {
        "tinydep.py": "ANSWER = 42\n",
        "tinydep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinydep\nVersion: 1.0\n",
        "tinydep-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "tinydep-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinydep-1.0.dist-info/RECORD", record)
    return wheel


def test_it_installs_requirements_into_the_plugins_own_venv_and_runs_hooks_with_it(engine, ehome, tmp_path):
    src = """
    import json, sys
    sys.stdin.read()
    import tinydep
    print(json.dumps({"memories": [{"content": f"answer {tinydep.ANSWER} from {sys.prefix}"}]}))
    """
    pdir = make_plugin(ehome.plugins_dir, "deps", {"ingest": src})
    wheel = _tiny_wheel(pdir)  # (the install sees the plugin's own directory, not the rest of the host's /tmp)
    (pdir / "requirements.txt").write_text(f"{wheel}\n")
    write_config(ehome.root, plugin="deps")
    assert engine.handle("ingest", {"message": "m", "agent_id": "a"}).source == "default"  # not installed yet
    ok, output = install_requirements(pdir, ehome.data_dir("deps"), timeout=180)
    assert ok, output
    venv = ehome.data_dir("deps") / "venv"
    reply = engine.handle("ingest", {"message": "m", "agent_id": "a"})
    assert reply.result["memories"] == [{"content": f"answer 42 from {venv}", "scope": "hook"}]


def test_it_reports_a_missing_requirements_file_as_nothing_to_do(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "plugin.toml").write_text('name = "p"\n')
    assert install_requirements(pdir, tmp_path / "data") == (True, "No requirements.txt found — nothing to install")


def test_it_gives_up_on_a_requirements_install_at_its_timeout_and_keeps_the_old_venv(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "plugin.toml").write_text('name = "p"\nrequirements = "deps.txt"\n')
    (pdir / "deps.txt").write_text("definitely-not-a-real-package-xyz==1.0\n")
    data = tmp_path / "data"
    (data / "venv" / "bin").mkdir(parents=True)
    (data / "venv" / "marker").write_text("old")
    ok, output = install_requirements(pdir, data, timeout=0.05)
    assert not ok and "timed out" in output
    assert (data / "venv" / "marker").read_text() == "old"
    assert not (data / "venv.new").exists()


def test_it_refuses_a_requirements_path_outside_the_plugin(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    (pdir / "plugin.toml").write_text('name = "p"\nrequirements = "../x.txt"\n')
    ok, output = install_requirements(pdir, tmp_path / "data")
    assert not ok and "must not contain '..'" in output


def test_findings_serialise_with_id_severity_message_and_hint():
    _, found = parse('name = "p"\nzzz = 1\n')
    assert json.loads(json.dumps([f.to_dict() for f in found])) == [
        {"id": "manifest.unknown_key", "severity": "warning", "message": "unknown top-level key `zzz` is ignored",
         "hint": "Check the spelling against the plugin.toml reference."}]


def test_every_finding_id_the_engine_emits_is_catalogued():
    import re

    from engine.findings import ENGINE_FINDINGS
    from engine.plugins import catalog, loader, manifest

    emitted = set()
    for module in (manifest, loader, catalog):
        text = Path(module.__file__).read_text()
        emitted |= set(re.findall(r'F\.(?:error|warning)\(\s*"([a-z_]+\.[a-z_]+)"', text))
    assert emitted and emitted == set(ENGINE_FINDINGS)


def test_install_requirements_result_unpacks_and_serialises(engine, ehome, tmp_path):
    pdir = make_plugin(ehome.plugins_dir, "deps2", {"ingest": ECHO})
    (pdir / "requirements.txt").write_text(f"{_tiny_wheel(pdir)}\n")
    manifest = engine.catalog.get("deps2").plugin.manifest
    result = install_requirements(pdir, manifest, ehome)  # the API's call shape: data dir from the home
    ok, output = result
    assert ok and (ehome.data_dir("deps2") / "venv" / "bin" / "python").exists()
    assert result.to_dict()["success"] is True and result.to_dict()["output"] == output
    (pdir / "requirements.txt").write_text("definitely-not-a-real-package-xyz==1.0\n")
    failed = install_requirements(pdir, ehome.data_dir("deps2"), 0.05).to_dict()
    assert failed["ok"] is False and failed["error"] == "killed: timed out after 0.05s"


def test_it_serves_the_last_good_manifest_after_a_bad_edit_even_in_a_new_process(ehome):
    from engine.plugins.catalog import Catalog
    from tests.plugin_factory import make_plugin

    pdir = make_plugin(ehome.plugins_dir, "steady", {"ingest": "print('{}')\n"}, toml_extra="hook_timeout_secs = 7")
    assert Catalog(ehome).get("steady").valid  # first load remembers plugin.toml
    (pdir / "plugin.toml").write_text("name = \"steady\"\n[hooks\n")  # broken edit
    fresh = Catalog(ehome)  # e.g. a worker started after the edit
    entry = fresh.get("steady")
    assert entry.plugin is not None and entry.plugin.manifest.hooks.hook_timeout_secs == 7
    assert not entry.valid and any(f.id == "manifest.stale" for f in entry.problems)
    assert any(f.id == "manifest.toml_syntax" for f in entry.problems)
