"""WASM tool plugins: manifest rules, package/install (tamper, traversal, symlinks), state, hash policy, execution."""

import io
import json
import tarfile

import pytest

from engine import protocol as P
from engine import wasm as W
from engine.wasm import tools as T
from tests.fixtures.wasm.wat import fixture_wasm, static_output_wasm, tool_manifest

ECHO = fixture_wasm("echo")


def installed(ehome, tool_id="echo", wasm=ECHO, version="0.1.0", **extra):
    return T.install(ehome, T.package(tool_manifest(tool_id, wasm, version, **extra), wasm))


def raw_tar(entries) -> bytes:
    """entries: (name, bytes | None, kind) with kind "file", "symlink" or "hardlink"."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data, kind in entries:
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, "manifest.json"
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return out.getvalue()


def manifest_bytes(wasm=ECHO, **extra) -> bytes:
    return json.dumps(tool_manifest("echo", wasm, **extra)).encode()


def test_it_packages_and_installs_the_agentzero_layout(ehome):
    manifest = tool_manifest("echo", ECHO)
    manifest["wasm_sha256"] = "0" * 64  # as AgentZero's example manifests ship
    data = T.package(manifest, ECHO)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == ["manifest.json", "plugin.wasm"]
        packed = json.loads(tar.extractfile("manifest.json").read())
    assert packed["wasm_sha256"] == T.sha256_hex(ECHO)  # recomputed
    tool = T.install(ehome, data)
    assert tool.dir == ehome.tools_dir / "echo" / "0.1.0"
    assert (tool.dir / "manifest.json").exists() and (tool.dir / "plugin.wasm").read_bytes() == ECHO
    assert (ehome.tools_dir / ".agentzero-plugins.lock").exists()
    state = json.loads((ehome.tools_dir / "plugin-state.json").read_text())
    assert state["plugins"]["echo"]["enabled"] is True and state["plugins"]["echo"]["source"] == "local"


def test_it_refuses_a_tampered_package(ehome):
    data = raw_tar([("manifest.json", manifest_bytes(wasm_sha256="f" * 64), "file"), ("plugin.wasm", ECHO, "file")])
    with pytest.raises(T.ToolError, match="integrity check failed for `plugin.wasm`: checksum mismatch"):
        T.install(ehome, data)
    assert not (ehome.tools_dir / "echo").exists()


@pytest.mark.parametrize("name", ["../evil.wasm", "/etc/evil", "sub/../../x"])
def test_it_refuses_path_traversal_in_a_package(ehome, name):
    data = raw_tar([("manifest.json", manifest_bytes(), "file"), ("plugin.wasm", ECHO, "file"), (name, b"x", "file")])
    with pytest.raises(T.ToolError, match="path traversal"):
        T.install(ehome, data)


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_it_refuses_links_in_a_package(ehome, kind):
    data = raw_tar([("manifest.json", manifest_bytes(), "file"), ("plugin.wasm", None, kind)])
    with pytest.raises(T.ToolError, match="symlink"):
        T.install(ehome, data)


def test_it_refuses_packages_missing_parts_or_not_tar(ehome):
    with pytest.raises(T.ToolError, match="package missing manifest.json"):
        T.install(ehome, raw_tar([("plugin.wasm", ECHO, "file")]))
    with pytest.raises(T.ToolError, match="package missing wasm module `plugin.wasm`"):
        T.install(ehome, raw_tar([("manifest.json", manifest_bytes(), "file")]))
    with pytest.raises(T.ToolError, match="not a tar archive|not a valid tar"):
        T.install(ehome, b"definitely not a tar" * 50)


def test_it_refuses_a_package_whose_module_is_not_wasm(ehome):
    junk = b"\0asm\x01\0\0\0garbage"
    with pytest.raises(T.ToolError, match="not a valid wasm module"):
        T.install(ehome, T.package(tool_manifest("junk", junk), junk))


@pytest.mark.parametrize("change,message", [
    ({"id": ""}, "plugin id cannot be empty"),
    ({"id": "../x"}, "must be lowercase"),
    ({"version": "../1"}, "not a valid version"),
    ({"entrypoint": ""}, "plugin entrypoint cannot be empty"),
    ({"wasm_file": "plugin.txt"}, "plugin wasm_file must end with .wasm"),
    ({"wasm_file": "../plugin.wasm"}, "plain file name"),
    ({"wasm_sha256": "abc"}, "plugin wasm_sha256 must be a 64-char hex digest"),
    ({"min_runtime_api": 3, "max_runtime_api": 3}, "runtime API compatibility failed: current=2, supported=3..=3"),
    ({"min_runtime_api": 1, "max_runtime_api": 1}, "SDK v2"),
])
def test_it_validates_manifests_with_agentzero_messages(change, message):
    with pytest.raises(T.ToolError, match=message.replace(".", r"\.").replace("(", r"\(")):
        T.parse_manifest({**tool_manifest("echo", ECHO), **change})


def test_it_requires_allowed_host_calls_and_defaults_the_rest():
    raw = tool_manifest("echo", ECHO)
    for key in ("capabilities", "min_runtime_api", "max_runtime_api"):
        raw.pop(key)
    parsed = T.parse_manifest({**raw, "privacy": "ignored"})
    assert (parsed.capabilities, parsed.min_runtime_api, parsed.max_runtime_api) == ([], 2, 2)
    raw.pop("allowed_host_calls")
    with pytest.raises(T.ToolError, match="allowed_host_calls"):
        T.parse_manifest(raw)


def test_it_executes_a_tool_through_the_abi(ehome):
    installed(ehome)
    run = T.execute(ehome, "echo", '{"task":"hello"}', policy=W.WasmPolicy())
    assert (run.ok, run.output, run.error) == (True, "echo:ok", None)


def test_it_frames_the_input_as_agentzero_does(ehome):
    installed(ehome, "mirror", fixture_wasm("reflect"))
    run = T.execute(ehome, "mirror", "hello", policy=W.WasmPolicy())
    workspace = str(ehome.root / "workspace")
    assert not run.ok and run.kind == P.INVALID_OUTPUT and "missing field `output`" in run.error
    assert json.dumps({"input": "hello", "workspace_root": workspace}) in run.error


@pytest.mark.parametrize("output,expected", [
    ({"output": "", "error": "x"}, (False, "", "plugin error: x")),
    ({"output": "r", "error": "w"}, (True, "r\n[plugin warning: w]", None)),
    ({"output": "fine", "privacy_boundary": "any"}, (True, "fine", None)),
])
def test_it_maps_errors_and_warnings(ehome, output, expected):
    installed(ehome, "mapper", static_output_wasm(output))
    run = T.execute(ehome, "mapper", "", policy=W.WasmPolicy())
    assert (run.ok, run.output, run.error) == expected


@pytest.mark.parametrize("raw,kw,needle", [
    (b"", {"ptr": 0, "length": 0}, "plugin returned empty output"),
    (b"x", {"ptr": 65500, "length": 100}, "exceeds memory bounds"),
    (b"\xff\xfe", {}, "not valid UTF-8"),
    (b"not json", {}, "not valid JSON"),
    (b'{"error": null}', {}, "missing field `output`"),
])
def test_it_fails_bad_output_cleanly(ehome, raw, kw, needle):
    installed(ehome, "bad", static_output_wasm(raw, **kw))
    run = T.execute(ehome, "bad", "", policy=W.WasmPolicy())
    assert not run.ok and run.output == "" and needle in run.error


def test_it_warns_on_a_hash_mismatch_under_warn(ehome):
    tool = installed(ehome)
    tool.wasm_path.write_bytes(static_output_wasm({"output": "swapped", "error": None}))
    run = T.execute(ehome, "echo", "", policy=W.WasmPolicy(module_hash_policy="warn"))
    assert run.ok and run.output == "swapped"
    assert "module_hash_policy=warn" in run.warnings[0]
    assert any(line.startswith("[WARN] module_hash_policy=warn") for line in run.logs)


def test_it_refuses_a_hash_mismatch_under_enforce(ehome):
    tool = installed(ehome)
    tool.wasm_path.write_bytes(static_output_wasm({"output": "swapped", "error": None}))
    run = T.execute(ehome, "echo", "", policy=W.WasmPolicy(module_hash_policy="enforce"))
    assert not run.ok and run.kind == W.HASH_MISMATCH and run.output == "" and "refused" in run.error
    skipped = T.execute(ehome, "echo", "", policy=W.WasmPolicy(module_hash_policy="skip"))
    assert skipped.ok and not skipped.warnings


def test_it_runs_an_unmodified_tool_under_enforce(ehome):
    installed(ehome)
    assert T.execute(ehome, "echo", "", policy=W.WasmPolicy(module_hash_policy="enforce")).ok


def test_it_stops_a_looping_tool_and_keeps_serving(ehome):
    installed(ehome, "spin", fixture_wasm("loop"))
    installed(ehome)
    run = T.execute(ehome, "spin", "", policy=W.WasmPolicy(max_execution_ms=50))
    assert not run.ok and run.kind == P.TIMEOUT and "exceeded time limit (50 ms)" in run.error
    assert T.execute(ehome, "echo", "", policy=W.WasmPolicy()).ok


def test_it_gates_tool_host_calls_by_capabilities_and_policy(ehome, monkeypatch):
    installed(ehome, "envtool", fixture_wasm("host_env_get"), capabilities=["host:az_env_get"])
    denied = T.execute(ehome, "envtool", "", policy=W.WasmPolicy())
    assert denied.kind == W.IMPORT_DENIED and "not permitted by isolation policy" in denied.error
    policy = W.WasmPolicy(allowed_host_calls=("az::az_env_get",), allowed_env_vars=("ALLOWED",))
    allowed = T.execute(ehome, "envtool", "", policy=policy, environ={"ALLOWED": "1", "SECRET": "2"})
    # The module's input is the framed JSON (no such variable): the call is linked and returns 0 -> "<none>".
    assert allowed.kind == P.INVALID_OUTPUT and "<none>" in allowed.error


def test_it_lists_the_semver_latest_version_and_state(ehome):
    installed(ehome, version="0.2.0")
    installed(ehome, version="0.10.0")
    [tool] = T.list_tools(ehome)
    assert tool.version == "0.10.0" and tool.enabled
    assert T.describe(tool, W.WasmPolicy())["module_name"] is None  # describe() runs no module code
    assert T.refresh_info(tool, W.WasmPolicy())["name"] == "echo_plugin"  # a worker asks the module
    info = T.describe(tool, W.WasmPolicy())
    assert info["module_name"] == "echo_plugin" and info["hash_ok"] is True and not info["problems"]


def test_it_fills_in_the_module_name_on_first_execution_and_forgets_it_when_the_module_changes(ehome):
    tool = installed(ehome)
    assert T.execute(ehome, "echo", "", policy=W.WasmPolicy()).ok
    assert T.describe(tool, W.WasmPolicy())["module_name"] == "echo_plugin"
    tool.wasm_path.write_bytes(static_output_wasm({"output": "v2"}))
    info = T.describe(tool, W.WasmPolicy())
    assert info["module_name"] is None and info["hash_ok"] is False


def test_it_enables_disables_and_removes(ehome):
    installed(ehome)
    assert T.set_enabled(ehome, "echo", False).enabled is False
    with pytest.raises(T.ToolError) as info:
        T.execute(ehome, "echo", "", policy=W.WasmPolicy())
    assert info.value.status == 409
    assert T.set_enabled(ehome, "echo", True).enabled is True
    installed(ehome)  # reinstall re-enables and replaces in place
    assert T.remove(ehome, "echo") == 1
    assert T.list_tools(ehome) == []
    with pytest.raises(T.ToolError) as missing:
        T.get_tool(ehome, "echo")
    assert missing.value.status == 404


def test_it_treats_a_missing_state_file_as_enabled(ehome):
    installed(ehome)
    (ehome.tools_dir / "plugin-state.json").unlink()
    assert T.list_tools(ehome)[0].enabled is True
    (ehome.tools_dir / "plugin-state.json").write_text("{broken")
    assert T.list_tools(ehome)[0].enabled is True


def test_it_reports_a_broken_installed_manifest_without_crashing(ehome):
    tool = installed(ehome)
    (tool.dir / "manifest.json").write_text("{not json")
    [broken] = T.list_tools(ehome)
    assert broken.manifest is None and "not valid JSON" in broken.problems[0]
    run = T.execute(ehome, "echo", "", policy=W.WasmPolicy())
    assert not run.ok and run.kind == P.MANIFEST_INVALID


def test_it_reports_a_refused_import_when_listing_before_any_call(ehome):
    installed(ehome, "envtool", fixture_wasm("host_env_get"))
    info = T.describe(T.get_tool(ehome, "envtool"), W.WasmPolicy())
    assert any("az::az_env_get` is imported but not declared" in p for p in info["problems"])


def test_it_discovers_a_flat_development_layout_and_reports_a_missing_module(ehome):
    flat = ehome.tools_dir / "devtool"
    flat.mkdir(parents=True)
    (flat / "manifest.json").write_text(json.dumps(tool_manifest("devtool", ECHO)))
    (flat / "plugin.wasm").write_bytes(ECHO)
    gone = ehome.tools_dir / "gone" / "1.0.0"
    gone.mkdir(parents=True)
    (gone / "manifest.json").write_text(json.dumps(tool_manifest("gone", ECHO, version="1.0.0")))
    tools = {t.id: t for t in T.list_tools(ehome)}
    assert tools["devtool"].dir == flat and not tools["devtool"].problems
    assert T.execute(ehome, "devtool", "", policy=W.WasmPolicy()).output == "echo:ok"
    assert "wasm file `plugin.wasm` is missing" in tools["gone"].problems
    run = T.execute(ehome, "gone", "", policy=W.WasmPolicy())
    assert not run.ok and run.kind == P.MANIFEST_INVALID


def test_it_fetches_packages_by_url_with_an_optional_sha(ehome, tmp_path):
    data = T.package(tool_manifest("echo", ECHO), ECHO)
    tar = tmp_path / "echo.tar"
    tar.write_bytes(data)
    assert T.fetch_package(tar.as_uri()) == data
    assert T.fetch_package(tar.as_uri(), T.sha256_hex(data).upper()) == data
    with pytest.raises(T.ToolError, match="SHA256 mismatch: expected 0+, got "):
        T.fetch_package(tar.as_uri(), "0" * 64)
    with pytest.raises(T.ToolError, match="unsupported URL scheme"):
        T.fetch_package("ftp://example.org/echo.tar")
    with pytest.raises(T.ToolError, match="cannot read"):
        T.fetch_package((tmp_path / "missing.tar").as_uri())
