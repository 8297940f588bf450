"""Runtime conformance (engine/process/runtimes.py): tag resolution, launch commands, and a real round trip through every
runtime whose launcher is installed here. Missing launchers are skipped with the reason."""

from __future__ import annotations

import os
import shutil

import pytest

from engine import protocol as P
from engine.process.runtimes import RUNTIMES, build_command, find_launcher, resolve_tag
from tests.engine.helpers import run

# ---- tags ----


@pytest.mark.parametrize("tag", [None, "", "python", "python3", "py", " PY "])
def test_it_defaults_to_python(tag):
    r = resolve_tag(tag)
    assert r.runtime.tag == "python" and r.warning is None


@pytest.mark.parametrize("tag,expected", [("V", "v"), ("VLang", "v"), ("Node", "node"), ("JS", "node"),
                                          ("nodejs", "node"), ("golang", "go"), ("binary", "native"),
                                          ("exec", "native"), ("ts", "deno"), ("typescript", "deno"),
                                          ("rb", "ruby"), ("sh", "bash"), ("shell", "bash"), ("bun", "bun"),
                                          ("php", "php"), ("lua", "lua"), ("webassembly", "wasm")])
def test_it_normalises_case_and_aliases(tag, expected):
    assert resolve_tag(tag).runtime.tag == expected


def test_it_falls_back_to_python_with_a_warning_for_unknown_tags():
    r = resolve_tag("brainfuck")
    assert r.runtime.tag == "python"
    assert r.warning.startswith("unknown runtime 'brainfuck'; falling back to python")


@pytest.mark.parametrize("path", ["/opt/homebrew/bin/python3", "C:\\Python313\\python.exe"])
def test_it_treats_a_path_as_a_custom_launcher_keeping_its_case(path):
    r = resolve_tag(path)
    assert r.custom_launcher == path and r.label == path
    assert build_command(r, "/p/hooks/x.py") == [path, "/p/hooks/x.py"]


def test_it_uses_runtime_specific_version_args():
    assert RUNTIMES["go"].version_args == ("version",)
    assert RUNTIMES["lua"].version_args == ("-v",)
    assert RUNTIMES["python"].version_args == RUNTIMES["node"].version_args == ("--version",)


def test_it_builds_the_documented_launch_commands(monkeypatch):
    monkeypatch.setattr("engine.process.runtimes.find_launcher", lambda tag: f"/bin/{tag}")
    assert build_command(resolve_tag("v"), "s.v") == ["/bin/v", "-no-retry-compilation", "run", "s.v"]
    assert build_command(resolve_tag("native"), "/p/s") == ["/p/s"]
    assert build_command(resolve_tag("go"), "s.go") == ["/bin/go", "run", "s.go"]
    assert build_command(resolve_tag("deno"), "s.ts") == ["/bin/deno", "run", "--allow-read", "--allow-env", "s.ts"]
    assert build_command(resolve_tag("bun"), "s.ts") == ["/bin/bun", "run", "s.ts"]
    assert build_command(resolve_tag("ruby"), "s.rb") == ["/bin/ruby", "s.rb"]


def test_it_resolves_the_python_launcher_once_to_its_real_path():
    exe = find_launcher("python")
    assert exe and os.path.isabs(exe) and exe == os.path.realpath(exe)
    assert find_launcher("python") is exe  # cached for the process


def test_it_finds_lua54_for_the_lua_tag(tmp_path, monkeypatch):
    lua54 = shutil.which("lua5.4")
    if not lua54:
        pytest.skip("lua5.4 is not installed (apt install lua5.4)")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "lua5.4").symlink_to(lua54)
    monkeypatch.setenv("PATH", str(bindir))
    assert find_launcher.__wrapped__("lua") == os.path.realpath(lua54)


# ---- a real round trip per runtime ----

SCRIPTS = {
    "python": ("py", """
        import json, os, sys
        req = json.loads(sys.stdin.read())
        print(json.dumps({"memories": [{"content": "python:" + req["message"] + ":" + os.environ["LIBREFANG_RUNTIME"]}]}))
    """),
    "node": ("js", """
        let d = '';
        process.stdin.on('data', c => d += c).on('end', () => {
          const r = JSON.parse(d);
          console.log(JSON.stringify({memories: [{content: 'node:' + r.message + ':' + process.env.LIBREFANG_RUNTIME}]}));
        });
    """),
    "bash": ("sh", """
        read -r line
        echo "{\\"memories\\": [{\\"content\\": \\"bash:$LIBREFANG_MESSAGE:$LIBREFANG_RUNTIME\\"}]}"
    """),
    "ruby": ("rb", """
        require 'json'
        r = JSON.parse(STDIN.read)
        puts({memories: [{content: "ruby:#{r['message']}:#{ENV['LIBREFANG_RUNTIME']}"}]}.to_json)
    """),
    "php": ("php", """
        <?php
        $r = json_decode(stream_get_contents(STDIN), true);
        echo json_encode(["memories" => [["content" => "php:" . $r["message"] . ":" . getenv("LIBREFANG_RUNTIME")]]]), "\\n";
    """),
    "lua": ("lua", """
        local _ = io.read("a")
        print('{"memories": [{"content": "lua:' .. os.getenv("LIBREFANG_MESSAGE") .. ':' .. os.getenv("LIBREFANG_RUNTIME") .. '"}]}')
    """),
    "deno": ("ts", """
        const text = await new Response(Deno.stdin.readable).text();
        const r = JSON.parse(text);
        console.log(JSON.stringify({memories: [{content: "deno:" + r.message + ":" + Deno.env.get("LIBREFANG_RUNTIME")}]}));
    """),
    "bun": ("ts", """
        const r = JSON.parse(await Bun.stdin.text());
        console.log(JSON.stringify({memories: [{content: "bun:" + r.message + ":" + process.env.LIBREFANG_RUNTIME}]}));
    """),
    "go": ("go", """
        package main
        import ("encoding/json"; "fmt"; "os")
        func main() {
            var r map[string]any
            json.NewDecoder(os.Stdin).Decode(&r)
            fmt.Printf("{\\"memories\\": [{\\"content\\": \\"go:%v:%s\\"}]}\\n", r["message"], os.Getenv("LIBREFANG_RUNTIME"))
        }
    """),
    "v": ("v", """
        import os
        fn main() {
            _ := os.get_raw_lines()
            println('{"memories": [{"content": "v:' + os.getenv('LIBREFANG_MESSAGE') + ':' + os.getenv('LIBREFANG_RUNTIME') + '"}]}')
        }
    """),
}


@pytest.mark.parametrize("tag", sorted(SCRIPTS))
def test_it_runs_a_hook_in_each_installed_runtime(tmp_path, tag):
    runtime = RUNTIMES[tag]
    if find_launcher(tag) is None:
        pytest.skip(f"launcher {runtime.launcher!r} for the {tag} runtime is not installed here: {runtime.install_hint}")
    ext, src = SCRIPTS[tag]
    pdir = tmp_path / "p"
    pdir.mkdir()
    r = run(pdir, src, {"type": "ingest", "message": "kafka", "agent_id": "a"}, runtime=tag,
            name=f"hooks/ingest.{ext}", timeout=60)
    assert r.ok, (r.failure, r.stderr)
    assert r.reply == {"memories": [{"content": f"{tag}:kafka:{tag}"}]}


def test_it_runs_a_native_hook_with_its_exec_bit_and_refuses_one_without(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    src = "#!/bin/sh\ncat >/dev/null\necho '{\"type\": \"ingest_result\", \"memories\": [{\"content\": \"native\"}]}'\n"
    hook = pdir / "hooks" / "ingest"
    hook.parent.mkdir()
    hook.write_text(src)
    hook.chmod(0o755)
    r = run(pdir, None, runtime="native", name="hooks/ingest")
    assert r.reply == {"type": "ingest_result", "memories": [{"content": "native"}]}
    hook.chmod(0o644)
    r = run(pdir, None, runtime="native", name="hooks/ingest")
    assert r.failure.kind == P.SPAWN_FAILED and "exec bit" in r.failure.message


def test_it_runs_a_custom_absolute_launcher(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    r = run(pdir, "cat >/dev/null\necho '{\"content\": \"via /bin/sh\"}'\n", runtime="/bin/sh", name="hooks/t.sh")
    assert r.reply == {"content": "via /bin/sh"}
    r = run(pdir, None, runtime="/nonexistent/launcher", name="hooks/t.sh")
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND


def test_it_runs_an_unknown_tag_as_python(tmp_path):
    pdir = tmp_path / "p"
    pdir.mkdir()
    r = run(pdir, "import sys, json; sys.stdin.read(); print(json.dumps(sys.version_info[0]))", runtime="brainfuck")
    assert r.reply == 3


def test_it_fails_a_missing_launcher_with_its_install_hint(tmp_path, monkeypatch):
    monkeypatch.setattr("engine.process.runtimes.find_launcher", lambda tag: None)
    pdir = tmp_path / "p"
    pdir.mkdir()
    r = run(pdir, "print(1)", runtime="ruby", name="hooks/x.rb")
    assert r.failure.kind == P.LAUNCHER_NOT_FOUND
    assert "apt install ruby" in r.failure.message
