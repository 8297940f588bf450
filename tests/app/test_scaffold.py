"""Scaffold templates: for every runtime whose launcher is installed, scaffold a plugin with all nine hooks and
actually run each hook through the engine."""

import tomllib

import pytest

from engine import hooks as H
from engine.plugins.scaffold import ScaffoldError, plan
from engine.plugins.scaffold_templates import SCAFFOLD_HOOKS, SHAPES
from engine.process.runtimes import RUNTIMES, find_launcher
from engine.stack import ContextEngine, EngineDeps
from plugins_app.models import AuditEntry
from plugins_app.selectors.examples import example_request
from plugins_app.services.plugins import PluginError, scaffold_plugin

TEXT_RUNTIMES = ["python", "node", "ruby", "php", "bash", "lua", "native", "deno", "bun", "go", "v"]
EXPECTED_TYPE = {H.INGEST: "ingest_result", H.ASSEMBLE: "assemble_result", H.COMPACT: "compact_result",
                 H.TRANSFORM_TOOL_RESULT: None}


def _installed(tag):
    return RUNTIMES[tag].launcher is None or find_launcher(tag) is not None


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", TEXT_RUNTIMES)
def test_it_scaffolds_hooks_that_run(home, runtime):
    if not _installed(runtime):
        pytest.skip(f"{runtime} launcher not installed")
    name = f"scaf-{runtime}"
    summary = scaffold_plugin(name, 'say "hi" \\ to [everyone]', runtime, list(H.ALL_HOOKS), actor="test")
    assert summary.valid and summary.hooks_valid and summary.runtime == runtime
    raw = tomllib.loads((home.plugin_dir(name) / "plugin.toml").read_text())
    assert raw["hooks"]["runtime"] == runtime and "runtime" not in raw
    assert raw["description"] == 'say "hi" \\ to [everyone]'
    engine = ContextEngine(EngineDeps(home=home))  # no DB recording thread in this test
    for hook in H.ALL_HOOKS:
        attempt = engine.test_hook(name, hook, example_request(hook))
        assert attempt.ok, (hook, attempt.failure, attempt.result.stderr)
        assert isinstance(attempt.reply, dict), (hook, attempt.reply)
        want = EXPECTED_TYPE.get(hook, "ok")
        if want:
            assert attempt.reply["type"] == want, (hook, attempt.reply)
        else:
            assert attempt.reply["type"] in ("skip", "transformed")
    assert AuditEntry.objects.filter(action="plugin.scaffold", target=name).exists()


@pytest.mark.django_db
def test_it_python_assemble_template_keeps_messages(home):
    scaffold_plugin("asm", "", "python", ["assemble", "compact"], actor="test")
    engine = ContextEngine(EngineDeps(home=home))
    req = example_request("assemble")
    attempt = engine.test_hook("asm", "assemble", req)
    assert attempt.reply["messages"] == req["messages"]
    attempt = engine.test_hook("asm", "compact", example_request("compact"))
    assert attempt.ok and attempt.reply["messages"] and "summary" in attempt.reply


@pytest.mark.django_db
def test_it_defaults_to_ingest_and_after_turn(home):
    summary = scaffold_plugin("defaults", "d", "python", None, actor="test")
    declared = {h for h, s in summary.hooks.items() if s}
    assert declared == {"ingest", "after_turn"}
    assert (home.plugin_dir("defaults") / "requirements.txt").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name,runtime,hooks,code,status", [
    ("../evil", "python", None, "invalid_name", 400),
    ("", "python", None, "invalid_name", 400),
    ("-x", "python", None, "invalid_name", 400),
    ("ok", "cobol", None, "invalid_runtime", 400),
    ("ok", "/usr/bin/python3", None, "invalid_runtime", 400),
    ("ok", "python", ["ingest", "nope"], "invalid_hook", 400),
])
def test_it_rejects_bad_scaffold_input(home, name, runtime, hooks, code, status):
    with pytest.raises(PluginError) as exc:
        scaffold_plugin(name, "d", runtime, hooks, actor="test")
    assert (exc.value.code, exc.value.status) == (code, status)
    assert not any(p for p in home.plugins_dir.iterdir() if not p.name.startswith("."))


@pytest.mark.django_db
def test_it_refuses_an_existing_plugin(home):
    scaffold_plugin("twice", "", "bash", None, actor="test")
    before = (home.plugin_dir("twice") / "plugin.toml").read_text()
    with pytest.raises(PluginError) as exc:
        scaffold_plugin("twice", "other", "python", None, actor="test")
    assert exc.value.status == 409 and exc.value.code == "already_exists"
    assert (home.plugin_dir("twice") / "plugin.toml").read_text() == before


@pytest.mark.parametrize("runtime", TEXT_RUNTIMES)
def test_it_has_a_template_for_every_runtime_with_runtime_inside_hooks(runtime):
    p = plan("every", 'quote " and \\ backslash', runtime, list(H.ALL_HOOKS))
    raw = tomllib.loads(p.files["plugin.toml"].decode())
    assert raw["hooks"]["runtime"] == runtime and "runtime" not in raw
    assert all(p.files[raw["hooks"][h]] for h in H.ALL_HOOKS)


def test_it_rejects_control_characters_in_description():
    with pytest.raises(ScaffoldError):
        plan("x", "bad\x00", "python", None)


@pytest.mark.django_db
def test_it_scaffolds_wasm_modules_that_run_or_says_it_cannot(home):
    try:
        from engine import wasm
    except ImportError:
        wasm = None
    if wasm is None:
        with pytest.raises(ScaffoldError) as exc:
            plan("w", "d", "wasm", None)
        assert exc.value.code == "runtime_not_scaffoldable"
        return
    summary = scaffold_plugin("wasmy", "d", "wasm", ["ingest", "assemble", "after_turn"], actor="test")
    assert summary.runtime == "wasm" and summary.hooks_valid
    engine = ContextEngine(EngineDeps(home=home))
    for hook in ("ingest", "assemble", "after_turn"):
        attempt = engine.test_hook("wasmy", hook, example_request(hook))
        assert attempt.ok and isinstance(attempt.reply, dict), (hook, attempt.failure)


# ---- every template passes a real agent call (issue: the test console said "ok" while agents fell back) ----

SCAFFOLD_RUNTIMES = [*TEXT_RUNTIMES, "wasm"]


def _serve(home, name):
    home.config_path.write_text(f'[context_engine]\nplugin = "{name}"\n')


@pytest.mark.django_db
@pytest.mark.parametrize("runtime", SCAFFOLD_RUNTIMES)
def test_it_scaffolds_seven_hooks_that_pass_real_agent_calls(home, runtime):
    if not _installed(runtime):
        pytest.skip(f"{runtime} launcher not installed")
    name = f"real-{runtime}"
    scaffold_plugin(name, "d", runtime, list(SCAFFOLD_HOOKS), actor="test", author="Ada")
    _serve(home, name)
    engine = ContextEngine(EngineDeps(home=home))
    for hook in SCAFFOLD_HOOKS:
        request = example_request(hook)
        reply = engine.handle(hook, request)
        assert reply.source == name and reply.fallback_reason is None, (hook, reply)
        if hook in (H.ASSEMBLE, H.COMPACT):
            assert reply.result["messages"] == request["messages"], (hook, reply.result)
        # the test console's verdict is the agent call's verdict
        attempt = engine.test_hook(name, hook, request)
        assert attempt.ok and engine.judge(hook, request, attempt.reply) == (True, None), (hook, attempt.failure)


@pytest.mark.parametrize("runtime", SCAFFOLD_RUNTIMES)
def test_it_writes_all_seven_templates_and_comments_out_the_unused_ones(runtime):
    try:
        p = plan("seven", "d", runtime, None, author="Ada")
    except ScaffoldError as exc:  # wasm without wasmtime
        pytest.skip(exc.message)
    text = p.files["plugin.toml"].decode()
    raw = tomllib.loads(text)
    assert raw["author"] == "Ada"
    active = {h for h in H.ALL_HOOKS if h in raw["hooks"]}
    assert active == {H.INGEST, H.AFTER_TURN}
    for hook in SCAFFOLD_HOOKS:
        rel = next(f for f in p.files if (f.startswith(f"hooks/{hook}.") or f == f"hooks/{hook}")
                   and not f.endswith(".wat"))
        if hook not in active:
            line = f'# {hook} = "{rel}"'
            assert line in text.splitlines(), (hook, text)
            request, reply = SHAPES[hook]
            assert f"receives {request}" in text and f"answers {reply}" in text
    # uncommenting works: every commented hook line parses once the "# " is removed
    uncommented = "\n".join(ln[2:] if ln.startswith("# ") and " = \"hooks/" in ln else ln for ln in text.splitlines())
    assert {h for h in SCAFFOLD_HOOKS if h in tomllib.loads(uncommented)["hooks"]} == set(SCAFFOLD_HOOKS)


@pytest.mark.django_db
def test_it_uncommented_hooks_serve_agents(home):
    scaffold_plugin("uncomment", "d", "python", None, actor="test")
    path = home.plugin_dir("uncomment") / "plugin.toml"
    path.write_text(path.read_text().replace('# assemble = "hooks/assemble.py"', 'assemble = "hooks/assemble.py"'))
    _serve(home, "uncomment")
    reply = ContextEngine(EngineDeps(home=home)).handle(H.ASSEMBLE, example_request(H.ASSEMBLE))
    assert reply.source == "uncomment" and reply.fallback_reason is None


@pytest.mark.django_db
def test_it_judges_a_test_console_run_as_an_agent_call_does(home):
    """A plugin whose assemble answers no messages: the console shows the same failure the agent's fallback names."""
    scaffold_plugin("empty-asm", "d", "python", [H.ASSEMBLE], actor="test")
    script = home.plugin_dir("empty-asm") / "hooks" / "assemble.py"
    script.write_text('import json\nprint(json.dumps({"type": "assemble_result", "messages": []}))\n')
    _serve(home, "empty-asm")
    engine = ContextEngine(EngineDeps(home=home))
    request = example_request(H.ASSEMBLE)
    agent = engine.handle(H.ASSEMBLE, request)
    console = engine.test_hook("empty-asm", H.ASSEMBLE, request)
    assert agent.source == "default"
    assert not console.ok and console.failure.kind == "invalid_output"
    assert agent.fallback_reason == f"empty-asm: {console.failure}"
    assert engine.judge(H.ASSEMBLE, request, console.reply) == (False, str(console.failure))


# ---- what the engine tells agents and operators ----

def test_it_serves_the_last_good_manifest_any_process_loaded_not_an_older_one_it_kept(home):
    """Two catalogs stand for the web tier and a worker: after a failed edit both serve the newest good copy."""
    from engine.plugins.catalog import Catalog

    plan_files = plan("lg", "d", "python", [H.INGEST]).files
    pdir = home.plugin_dir("lg")
    for rel, data in plan_files.items():
        (pdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (pdir / rel).write_bytes(data)
    web, worker = Catalog(home), Catalog(home)
    assert worker.get("lg").plugin.manifest.hooks.hook_timeout_secs == 30  # the worker keeps version 1 in memory
    manifest = pdir / "plugin.toml"
    good = manifest.read_text()
    manifest.write_text(good.replace("[hooks]\n", "[hooks]\nhook_timeout_secs = 3\n"))
    assert web.validate("lg").manifest.hooks.hook_timeout_secs == 3  # the web tier reloads version 2
    manifest.write_text(good.replace("[hooks]\n", "[hooks]\nhook_timeout_secs = \n"))  # then a broken edit
    for catalog in (web, worker):
        entry = catalog.get("lg")
        assert entry.plugin.manifest.hooks.hook_timeout_secs == 3
        assert "manifest.stale" in [f.id for f in entry.problems]


@pytest.mark.django_db
def test_it_names_a_disabled_plugin_in_the_fallback_reason(home):
    scaffold_plugin("off", "d", "python", [H.ASSEMBLE], actor="test")
    _serve(home, "off")
    (home.plugin_dir("off") / ".disabled").touch()
    reply = ContextEngine(EngineDeps(home=home)).handle(H.ASSEMBLE, example_request(H.ASSEMBLE))
    assert reply.source == "default" and reply.fallback_reason == "plugin_disabled: off is disabled"


@pytest.mark.django_db
def test_it_does_not_log_a_fallback_when_a_later_stack_layer_answered(home, caplog):
    scaffold_plugin("broken-a", "d", "python", [H.ASSEMBLE], actor="test")
    scaffold_plugin("works-b", "d", "python", [H.ASSEMBLE], actor="test")
    (home.plugin_dir("broken-a") / "hooks" / "assemble.py").write_text("raise SystemExit(3)\n")
    home.config_path.write_text('[context_engine]\nplugin_stack = ["broken-a", "works-b"]\n')
    with caplog.at_level("WARNING", logger="librefang.engine"):
        reply = ContextEngine(EngineDeps(home=home)).handle(H.ASSEMBLE, example_request(H.ASSEMBLE))
    assert reply.source == "works-b" and reply.fallback_reason.startswith("broken-a: ")
    text = caplog.text
    assert "fell back to the default engine" not in text and "answered by works-b" in text


def test_it_refuses_unknown_runtimes_and_calls_a_missing_launcher_an_error(home):
    from engine.plugins.lint import lint_plugin

    pdir = home.plugin_dir("cob")
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.cob").write_text("x")
    (pdir / "plugin.toml").write_text('name = "cob"\n[hooks]\nruntime = "cobol"\ningest = "hooks/ingest.cob"\n')
    report = lint_plugin(pdir)
    assert [f.id for f in report.errors] == ["manifest.runtime_unknown"]
    missing = next((t for t in ("deno", "bun", "go", "v") if not _installed(t)), None)
    if missing is None:
        pytest.skip("every runtime is installed")
    scaffold_dir = home.plugin_dir("nolauncher")
    for rel, data in plan("nolauncher", "d", missing, [H.INGEST], author="a").files.items():
        (scaffold_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (scaffold_dir / rel).write_bytes(data)
    report = lint_plugin(scaffold_dir)
    assert "runtime.unavailable" in [f.id for f in report.errors]
    from engine.plugins.catalog import Catalog

    assert Catalog(home).get("nolauncher").cannot_run == f"{RUNTIMES[missing].launcher} not installed"
