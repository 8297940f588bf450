"""`runtime = "wasm"` hooks through the real engine: stack, fallback, stderr lines, recorded invocations, scaffold."""

import shutil

from engine import protocol as P
from engine import wasm as W
from tests.engine.helpers import approve
from tests.fixtures.wasm.wat import compile_wat, fixture_wasm, static_output_wasm
from tests.plugin_factory import write_config


def wasm_plugin(home, name, modules: dict[str, bytes], *, hooks_extra="", top_extra="") -> None:
    pdir = home.plugins_dir / name
    (pdir / "hooks").mkdir(parents=True)
    lines = [f'name = "{name}"', 'version = "0.1.0"', top_extra, "[hooks]", 'runtime = "wasm"', hooks_extra]
    for hook, wasm in modules.items():
        (pdir / "hooks" / f"{hook}.wasm").write_bytes(wasm)
        lines.append(f'{hook} = "hooks/{hook}.wasm"')
    (pdir / "plugin.toml").write_text("\n".join(lines) + "\n")


INGEST_REPLY = {"type": "ingest_result", "memories": [{"content": "from wasm"}]}


def test_it_answers_ingest_from_a_wasm_plugin_and_streams_az_log(ehome, engine, sinks):
    wasm_plugin(ehome, "wasmy", {"ingest": compile_wat(W.hook_wat("wasmy: ingest called", INGEST_REPLY))})
    write_config(ehome.root, plugin="wasmy")
    reply = engine.handle("ingest", {"message": "hi", "agent_id": "a1"})
    assert reply.source == "wasmy" and reply.fallback_reason is None
    assert reply.result["memories"][0]["content"] == "from wasm"
    assert ("wasmy", "ingest", "[INFO] wasmy: ingest called") in sinks["stderr"].lines
    [inv] = [i for i in sinks["invocations"].items if i.plugin == "wasmy"]
    assert inv.ok and inv.hook == "ingest" and "ingest called" in inv.stderr_tail


def test_it_passes_the_hook_request_json_as_the_abi_input(ehome, engine):
    wasm_plugin(ehome, "mirror", {"transform_tool_result": fixture_wasm("reflect")})
    attempt = engine.test_hook("mirror", "transform_tool_result",
                               {"agent_id": "a", "tool_name": "grep", "content": "x", "is_error": False})
    assert attempt.ok, attempt.failure
    assert attempt.reply["tool_name"] == "grep" and attempt.reply["content"] == "x"


def test_it_falls_back_to_default_when_a_wasm_hook_loops(ehome, engine, sinks):
    wasm_plugin(ehome, "spinner", {"ingest": fixture_wasm("loop")}, hooks_extra="hook_timeout_secs = 0.2")
    write_config(ehome.root, plugin="spinner")
    reply = engine.handle("ingest", {"message": "hi", "agent_id": "a1"})
    assert reply.source == "default"
    assert P.TIMEOUT in reply.fallback_reason
    [inv] = [i for i in sinks["invocations"].items if i.plugin == "spinner"]
    assert not inv.ok and inv.error_kind == P.TIMEOUT


def test_it_treats_empty_and_non_json_output_like_stdout(ehome, engine):
    wasm_plugin(ehome, "odd", {"ingest": static_output_wasm(b"", ptr=0, length=0),
                               "after_turn": static_output_wasm(b"plain words")})
    empty = engine.test_hook("odd", "ingest", {"message": "x", "agent_id": "a"})
    assert not empty.ok and empty.failure.kind == P.EMPTY_OUTPUT
    text = engine.test_hook("odd", "after_turn", {"agent_id": "a", "messages": []})
    assert text.ok and text.reply == {"text": "plain words"}


def test_it_reports_non_utf8_output_as_invalid(ehome, engine):
    wasm_plugin(ehome, "bytes", {"ingest": static_output_wasm(b"\xff\xfe")})
    attempt = engine.test_hook("bytes", "ingest", {"message": "x", "agent_id": "a"})
    assert attempt.failure.kind == P.INVALID_OUTPUT and "UTF-8" in attempt.failure.message


def test_it_gates_host_calls_by_manifest_capabilities_and_service_policy(ehome, engine, approvals):
    wasm_plugin(ehome, "envy", {"ingest": fixture_wasm("host_env_get")}, top_extra='[env]\nGREETING = "hej"\n')
    denied = engine.test_hook("envy", "ingest", {"message": "x", "agent_id": "a"})
    assert denied.failure.kind == W.IMPORT_DENIED and "not declared" in denied.failure.message
    text = (ehome.plugins_dir / "envy" / "plugin.toml").read_text()
    (ehome.plugins_dir / "envy" / "plugin.toml").write_text(
        text.replace("[hooks]", '[wasm]\ncapabilities = ["host:az_env_get"]\n\n[hooks]'))
    unapproved = engine.test_hook("envy", "ingest", {"message": "x", "agent_id": "a"})
    assert unapproved.failure.kind == W.IMPORT_DENIED and "not declared" in unapproved.failure.message
    approve(approvals, ehome.plugins_dir / "envy")
    refused = engine.test_hook("envy", "ingest", {"message": "x", "agent_id": "a"})
    assert refused.failure.kind == W.IMPORT_DENIED and "isolation policy" in refused.failure.message
    write_config(ehome.root, extra='[runtime.wasm]\nallowed_host_calls = ["az::az_env_get"]')
    # The module asks for the variable named by its input: here the whole request JSON, which is not set.
    allowed = engine.test_hook("envy", "ingest", {"message": "x", "agent_id": "a"})
    assert allowed.ok and allowed.reply == {"text": "<none>"}


def test_it_reads_env_from_the_hook_environment_not_the_service(ehome, monkeypatch):
    from engine.process.runner import HookCall
    from engine.process.runtimes import resolve_tag

    pdir = ehome.plugins_dir / "envy"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.wasm").write_bytes(fixture_wasm("host_env_get"))
    (pdir / "plugin.toml").write_text('name = "envy"\n[wasm]\ncapabilities = ["host:az_env_get"]\n')
    policy = W.WasmPolicy(allowed_host_calls=("az::az_env_get",))
    # The module reads the variable named by its raw input; a JSON string request "K" arrives as '"K"'.
    monkeypatch.setenv('"SERVICE_SECRET"', "leaked")

    def call(key, plugin_env):
        return W.run_wasm_hook(HookCall(plugin_dir=pdir, script="hooks/ingest.wasm", runtime=resolve_tag("wasm"),
                                        request=key, timeout_secs=5, plugin_env=plugin_env,
                                        data_dir=ehome.data_dir("envy")), policy=policy)

    assert call("GREETING", {'"GREETING"': "hej"}).reply == {"text": "hej"}
    assert call("SERVICE_SECRET", {}).reply == {"text": "<none>"}


def test_it_gates_by_the_calls_capabilities_without_rereading_the_manifest(ehome):
    from engine.process.runner import HookCall
    from engine.process.runtimes import resolve_tag

    pdir = ehome.plugins_dir / "envy"
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / "ingest.wasm").write_bytes(fixture_wasm("host_env_get"))
    (pdir / "plugin.toml").write_text('name = "envy"\n[wasm]\ncapabilities = ["host:az_env_get"]\n')
    policy = W.WasmPolicy(allowed_host_calls=("az::az_env_get",))

    def call(capabilities):
        return W.run_wasm_hook(HookCall(plugin_dir=pdir, script="hooks/ingest.wasm", runtime=resolve_tag("wasm"),
                                        request="K", timeout_secs=5, data_dir=ehome.data_dir("envy"),
                                        wasm_capabilities=capabilities), policy=policy)

    # The manifest declares the host call, but the call (as engine/invoke.py built it) carries none: denied.
    assert call(()).failure.kind == W.IMPORT_DENIED
    assert call(None).ok  # not set on the call: the manifest's


def test_hook_calls_carry_the_manifests_wasm_capabilities_once_approved(ehome, approvals):
    from engine.invoke import hook_call_for
    from engine.plugins.catalog import Catalog
    from engine.plugins.permissions import PermissionPolicy

    wasm_plugin(ehome, "envy", {"ingest": fixture_wasm("host_env_get")},
                top_extra='[wasm]\ncapabilities = ["host:az_env_get"]\n')
    policy = PermissionPolicy(approvals)
    call = hook_call_for(Catalog(ehome).get("envy"), "ingest", {"message": "x", "agent_id": "a"}, ehome, policy=policy)
    assert call.wasm_capabilities == ()
    approve(approvals, ehome.plugins_dir / "envy")
    call = hook_call_for(Catalog(ehome).get("envy"), "ingest", {"message": "x", "agent_id": "a"}, ehome, policy=policy)
    assert call.wasm_capabilities == ("host:az_env_get",)


def test_it_refuses_module_paths_that_escape_the_plugin(ehome, engine, tmp_path):
    outside = tmp_path / "outside.wasm"
    outside.write_bytes(fixture_wasm("echo"))
    wasm_plugin(ehome, "escaper", {})
    text = (ehome.plugins_dir / "escaper" / "plugin.toml").read_text()
    (ehome.plugins_dir / "escaper" / "plugin.toml").write_text(text + f'ingest = "../../{outside.name}"\n')
    attempt = engine.test_hook("escaper", "ingest", {"message": "x", "agent_id": "a"})
    assert not attempt.ok and attempt.failure.kind in (P.PATH_TRAVERSAL, P.MANIFEST_INVALID)


def test_it_scaffolds_a_working_wasm_plugin(ehome, engine, sinks):
    from engine.plugins.scaffold import plan
    from engine.plugins.scaffold_templates import SCAFFOLD_HOOKS

    files = plan("scaffy", 'says "hi"', "wasm", ["ingest", "assemble", "after_turn"]).files
    assert set(files) == {"plugin.toml", *(f"hooks/{h}.{ext}" for h in SCAFFOLD_HOOKS for ext in ("wasm", "wat"))}
    pdir = ehome.plugins_dir / "scaffy"
    for rel, data in files.items():
        (pdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (pdir / rel).write_bytes(data)
    from engine.plugins.loader import load_plugin

    loaded = load_plugin(pdir)
    assert loaded.manifest.runtime.runtime.tag == "wasm"
    assert not [f for f in loaded.findings if f.id == "manifest.unknown_key"]
    for hook, req in (("ingest", {"message": "x", "agent_id": "a"}),
                      ("assemble", {"agent_id": "a", "messages": [{"role": "user", "content": "x"}],
                                    "context_window_tokens": 1000}),
                      ("after_turn", {"agent_id": "a", "messages": []})):
        attempt = engine.test_hook("scaffy", hook, req)
        assert attempt.ok, (hook, attempt.failure)
    assert ("scaffy", "ingest", "[INFO] scaffy: ingest called") in sinks["stderr"].lines
    # the .wat source rebuilds the same module
    assert compile_wat(files["hooks/ingest.wat"].decode()) == files["hooks/ingest.wasm"]


def test_it_picks_up_a_replaced_module_on_the_next_call(ehome, engine):
    wasm_plugin(ehome, "swap", {"ingest": compile_wat(W.hook_wat("v1", INGEST_REPLY))})
    assert engine.test_hook("swap", "ingest", {"message": "x", "agent_id": "a"}).reply == INGEST_REPLY
    path = ehome.plugins_dir / "swap" / "hooks" / "ingest.wasm"
    new = {"type": "ingest_result", "memories": [{"content": "v2"}]}
    tmp = path.with_suffix(".new")
    tmp.write_bytes(compile_wat(W.hook_wat("v2", new)))
    tmp.replace(path)
    assert engine.test_hook("swap", "ingest", {"message": "x", "agent_id": "a"}).reply == new
    shutil.rmtree(ehome.plugins_dir / "swap" / "hooks" / ".cache")


def test_it_links_az_http_get_only_when_the_plugin_allows_network(ehome, engine, approvals):
    wasm_plugin(ehome, "netty", {"ingest": fixture_wasm("host_http_get")}, hooks_extra="allow_network = true",
                top_extra='[wasm]\ncapabilities = ["host:az_http_get"]\n')
    approve(approvals, ehome.plugins_dir / "netty")
    write_config(ehome.root, extra='[runtime.wasm]\nallowed_host_calls = ["az::az_http_get"]\n'
                                   'allowed_hosts = ["127.0.0.1"]')
    allowed = engine.test_hook("netty", "ingest", {"message": "x", "agent_id": "a"})
    assert allowed.ok, allowed.failure  # linked (the request JSON is not a URL, so the module gets 0 back)
    text = (ehome.plugins_dir / "netty" / "plugin.toml").read_text()
    (ehome.plugins_dir / "netty" / "plugin.toml").write_text(text.replace("allow_network = true",
                                                                          "allow_network = false"))
    approve(approvals, ehome.plugins_dir / "netty")
    denied = engine.test_hook("netty", "ingest", {"message": "x", "agent_id": "a"})
    assert denied.failure.kind == W.IMPORT_DENIED and "az_http_get" in denied.failure.message


def test_it_checks_wasm_plugins_statically_for_lint(ehome):
    wasm_plugin(ehome, "checked", {"ingest": fixture_wasm("host_env_get"), "assemble": fixture_wasm("missing_alloc"),
                                   "compact": fixture_wasm("echo")})
    pdir = ehome.plugins_dir / "checked"
    (pdir / "hooks" / "after_turn.wasm").write_bytes(b"not wasm")
    hooks = {"ingest": "hooks/ingest.wasm", "assemble": "hooks/assemble.wasm", "compact": "hooks/compact.wasm",
             "after_turn": "hooks/after_turn.wasm", "bootstrap": "hooks/missing.wasm"}
    found = {f.id: f for f in W.check_plugin(pdir, hooks, W.WasmPolicy())}
    assert set(found) == {"wasm.import_denied", "wasm.abi", "wasm.module_invalid", "wasm.module_missing"}
    assert "az_env_get" in found["wasm.import_denied"].message and found["wasm.import_denied"].hint


def test_it_scaffolds_every_hook_through_the_shared_scaffold_plan(ehome, engine):
    from engine.hooks import ALL_HOOKS
    from engine.plugins.scaffold import plan

    files = plan("everyhook", "all nine", "wasm", list(ALL_HOOKS)).files
    pdir = ehome.plugins_dir / "everyhook"
    for rel, data in files.items():
        (pdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (pdir / rel).write_bytes(data)
    request = {"agent_id": "a", "message": "x", "messages": [{"role": "user", "content": "x"}],
               "tool_name": "t", "content": "c", "event": {"name": "e"}}
    for hook in ALL_HOOKS:
        attempt = engine.test_hook("everyhook", hook, dict(request))
        assert attempt.ok, (hook, attempt.failure)
        if hook in ("assemble", "compact"):  # these echo the messages: an empty list would make agents fall back
            assert attempt.reply["messages"] == request["messages"], (hook, attempt.reply)
        else:
            assert attempt.reply == W.SCAFFOLD_REPLIES[hook]


def test_it_lints_wasm_modules(ehome):
    from engine.plugins.lint import lint_plugin

    wasm_plugin(ehome, "linty", {"ingest": fixture_wasm("host_env_get"), "assemble": fixture_wasm("echo")})
    ids = [f.id for f in lint_plugin(ehome.plugins_dir / "linty").findings]
    assert "wasm.import_denied" in ids and "wasm.abi" not in ids
