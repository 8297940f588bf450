"""ABI v2 host: real wasm modules built from the WAT fixtures in tests/fixtures/wasm, run by wasmtime."""

import http.server
import os
import threading

import pytest

from engine import protocol as P
from engine import wasm as W
from tests.fixtures.wasm.wat import compile_wat, static_output_wasm, write_fixture

POLICY = W.WasmPolicy()
ENV_POLICY = W.WasmPolicy(allowed_host_calls=("az::az_env_get",))


def run(path, data=b"{}", policy=POLICY, **kw):
    return W.execute(path, data, policy=policy, **kw)


def fails(path, kind, data=b"{}", policy=POLICY, **kw) -> str:
    with pytest.raises(W.WasmError) as info:
        run(path, data, policy, **kw)
    assert info.value.kind == kind, info.value.message
    return info.value.message


def test_it_round_trips_the_agentzero_echo_fixture(tmp_path):
    path = write_fixture(tmp_path, "echo")
    out = run(path, b'{"input":"{\\"task\\":\\"hello\\"}","workspace_root":"/tmp"}')
    assert out.output == b'{"output":"echo:ok","error":null}'
    assert W.describe(path, POLICY)["name"] == "echo_plugin"
    assert W.describe(path, POLICY)["schema"] is None


def test_it_packs_and_unpacks_pointer_and_length():
    for ptr, length in ((1024, 256), (0, 0), (2**32 - 1, 2**32 - 1)):
        assert W.unpack(W.pack(ptr, length)) == (ptr, length)
    assert W.pack(0, 0) == 0
    assert W.unpack(-1) == (2**32 - 1, 2**32 - 1)  # i64 results arrive signed


def test_it_hands_the_module_exactly_the_input_bytes(tmp_path):
    path = write_fixture(tmp_path, "reflect")
    data = '{"message":"héllo","n":1}'.encode()
    out = run(path, data)
    assert out.output == data
    assert out.logs == ["[INFO] reflect: request received"]


@pytest.mark.parametrize("fixture,needle", [
    ("missing_alloc", "'az_alloc'"),
    ("missing_memory", "does not export 'memory'"),
    ("missing_execute", "'az_tool_execute'"),
])
def test_it_refuses_modules_missing_a_required_export(tmp_path, fixture, needle):
    assert needle in fails(write_fixture(tmp_path, fixture), W.ABI_ERROR)


def test_it_refuses_bytes_that_are_not_a_module(tmp_path):
    path = tmp_path / "junk.wasm"
    path.write_bytes(b"\0asm garbage")
    assert "not a valid wasm module" in fails(path, W.MODULE_INVALID)


def test_it_always_links_az_log_and_ignores_bad_pointers_and_utf8(tmp_path):
    path = write_fixture(tmp_path, "log_bad")
    lines = []
    out = run(path, capabilities=(), on_log=lines.append)
    assert out.output == b'{"output":"logged","error":null}'
    assert lines == ["[ERROR] still alive"]


def test_it_denies_az_env_get_by_default(tmp_path):
    path = write_fixture(tmp_path, "host_env_get")
    assert "not permitted by isolation policy" in fails(path, W.IMPORT_DENIED, capabilities=["host:az_env_get"])


def test_it_denies_az_env_get_when_only_the_policy_allows_it(tmp_path):
    path = write_fixture(tmp_path, "host_env_get")
    assert "not declared" in fails(path, W.IMPORT_DENIED, policy=ENV_POLICY, capabilities=[])


@pytest.mark.parametrize("capability", ["host:az_env_get", "az::az_env_get"])
def test_it_reads_env_through_az_env_get_when_declared_and_allowed(tmp_path, capability):
    path = write_fixture(tmp_path, "host_env_get")
    env = {"GREETING": "bonjour"}
    assert run(path, b"GREETING", ENV_POLICY, capabilities=[capability], env=env).output == b"bonjour"
    assert run(path, b"UNSET_VAR", ENV_POLICY, capabilities=[capability], env=env).output == b"<none>"


def test_it_accepts_bare_host_call_names_in_the_policy(tmp_path):
    path = write_fixture(tmp_path, "host_env_get")
    policy = W.WasmPolicy(allowed_host_calls=("az_env_get",))
    assert run(path, b"K", policy, capabilities=["host:az_env_get"], env={"K": "v"}).output == b"v"


def test_it_confines_az_read_file_to_its_root(tmp_path):
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "note.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", root / "escape.txt")
    path = write_fixture(tmp_path / "mods", "host_read_file")
    policy = W.WasmPolicy(allowed_host_calls=("az::az_read_file",))
    kw = dict(policy=policy, capabilities=["host:az_read_file"], read_root=root)
    assert run(path, b"sub/note.txt", **kw).output == b"inside"
    for refused in (b"../secret.txt", str(tmp_path / "secret.txt").encode(), b"escape.txt", b"missing.txt"):
        logs = []
        assert run(path, refused, on_log=logs.append, **kw).output == b"<none>"
        assert logs and "az_read_file refused" in logs[0]


def test_it_denies_az_read_file_without_policy_and_allows_it_with_workspace_read(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("A")
    path = write_fixture(tmp_path / "mods", "host_read_file")
    fails(path, W.IMPORT_DENIED, b"a.txt", capabilities=["host:az_read_file"], read_root=root)
    policy = W.WasmPolicy(allow_workspace_read=True)
    assert run(path, b"a.txt", policy, capabilities=["wasi:filesystem/read"], read_root=root).output == b"A"


@pytest.fixture(scope="module")
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"hello from {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_it_fetches_allowlisted_urls_with_az_http_get(tmp_path, http_server):
    path = write_fixture(tmp_path, "host_http_get")
    policy = W.WasmPolicy(allowed_host_calls=("az::az_http_get",), allowed_hosts=("127.0.0.1",))
    out = run(path, f"{http_server}/weather".encode(), policy, capabilities=["host:az_http_get"])
    assert out.output == b"hello from /weather"


def test_it_refuses_hosts_outside_the_allowlist(tmp_path, http_server):
    path = write_fixture(tmp_path, "host_http_get")
    policy = W.WasmPolicy(allowed_host_calls=("az::az_http_get",), allowed_hosts=("example.org",))
    for url in (f"{http_server}/x", "file:///etc/passwd", "ftp://example.org/x"):
        logs = []
        out = run(path, url.encode(), policy, capabilities=["host:az_http_get"], on_log=logs.append)
        assert out.output == b"<none>"
        assert "az_http_get refused" in logs[0]


def test_it_denies_az_http_get_without_the_policy(tmp_path):
    path = write_fixture(tmp_path, "host_http_get")
    fails(path, W.IMPORT_DENIED, b"http://127.0.0.1/", capabilities=["host:az_http_get"])


def test_it_refuses_imports_outside_the_az_module(tmp_path):
    message = fails(write_fixture(tmp_path, "import_env_log"), W.IMPORT_DENIED)
    assert "host call `env::log` is not allowed" in message


def test_it_refuses_unknown_az_host_functions(tmp_path):
    wat = """(module (import "az" "az_frobnicate" (func (param i32)))
      (memory (export "memory") 1)
      (func (export "az_alloc") (param i32) (result i32) (i32.const 16))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (i64.const 0)))"""
    path = tmp_path / "frob.wasm"
    path.write_bytes(compile_wat(wat))
    assert "az::az_frobnicate` does not exist" in fails(path, W.IMPORT_DENIED, capabilities=["host:az_frobnicate"])


def test_it_stops_an_endless_loop_at_the_time_limit(tmp_path):
    message = fails(write_fixture(tmp_path, "loop"), P.TIMEOUT, timeout_secs=0.05)
    assert "exceeded time limit (50 ms)" in message


def test_it_stops_an_endless_loop_when_fuel_runs_out(tmp_path):
    policy = W.WasmPolicy(fuel_limit=100_000)
    assert "fuel budget" in fails(write_fixture(tmp_path, "loop"), W.FUEL_EXHAUSTED, policy=policy, timeout_secs=30)


def test_it_refuses_initial_memory_over_the_limit(tmp_path):
    policy = W.WasmPolicy(memory_limit_mb=1)
    assert "over the 1 MiB limit" in fails(write_fixture(tmp_path, "big_memory"), W.MEMORY_LIMIT, policy=policy)


def test_it_classifies_growing_past_the_memory_limit(tmp_path):
    policy = W.WasmPolicy(memory_limit_mb=2)
    assert "memory.grow was refused" in fails(write_fixture(tmp_path, "grow"), W.MEMORY_LIMIT, policy=policy)


def test_it_uses_the_smaller_of_policy_and_hook_memory_limits(tmp_path):
    path = write_fixture(tmp_path, "big_memory")
    assert run(path, policy=W.WasmPolicy(memory_limit_mb=4)).output == b""
    fails(path, W.MEMORY_LIMIT, policy=W.WasmPolicy(memory_limit_mb=4), memory_limit_mb=2)


def test_it_refuses_modules_over_the_size_limit(tmp_path):
    policy = W.WasmPolicy(max_module_bytes=8)
    assert "exceeds size policy" in fails(write_fixture(tmp_path, "echo"), W.MODULE_TOO_LARGE, policy=policy)


def test_it_refuses_symlinked_modules(tmp_path):
    real = write_fixture(tmp_path / "real", "echo")
    link = tmp_path / "link.wasm"
    os.symlink(real, link)
    fails(link, P.PATH_TRAVERSAL)


def test_it_returns_empty_output_for_a_zero_length(tmp_path):
    path = tmp_path / "empty.wasm"
    path.write_bytes(static_output_wasm(b"", ptr=0, length=0))
    assert run(path).output == b""


def test_it_refuses_output_outside_memory(tmp_path):
    path = tmp_path / "oob.wasm"
    path.write_bytes(static_output_wasm(b"x", ptr=65500, length=100))
    assert "exceeds memory bounds (65536)" in fails(path, P.INVALID_OUTPUT)


def test_it_refuses_output_that_is_not_utf8():
    with pytest.raises(W.WasmError) as info:
        W.decode_output(b"\xff\xfe{}")
    assert info.value.kind == P.INVALID_OUTPUT and "not valid UTF-8" in info.value.message


def test_it_writes_the_aot_cache_and_loads_it_in_a_new_process(tmp_path):
    path = write_fixture(tmp_path, "echo", as_name="plugin")
    W.clear_memory_cache()
    assert W.load_module(path, POLICY).cache == "compiled"
    cwasm, sha_file = W.cache_paths(path)
    assert cwasm == tmp_path / ".cache" / "plugin.cwasm" and sha_file == tmp_path / ".cache" / "source.sha256"
    assert cwasm.exists() and len(sha_file.read_text()) == 64
    assert W.load_module(path, POLICY).cache == "memory"
    W.clear_memory_cache()  # as a fresh worker would start
    loaded = W.load_module(path, POLICY)
    assert loaded.cache == "disk"
    assert run(path).output == b'{"output":"echo:ok","error":null}'


def test_it_recompiles_a_stale_cache(tmp_path):
    path = write_fixture(tmp_path, "echo", as_name="plugin")
    W.clear_memory_cache()
    W.load_module(path, POLICY)
    path.write_bytes(static_output_wasm({"output": "v2", "error": None}))  # the module changed
    W.clear_memory_cache()
    assert W.load_module(path, POLICY).cache == "recompiled-stale"
    assert run(path).output == b'{"output": "v2", "error": null}'


def test_it_recompiles_a_corrupt_cache_with_a_warning(tmp_path):
    path = write_fixture(tmp_path, "echo", as_name="plugin")
    W.clear_memory_cache()
    W.load_module(path, POLICY)
    cwasm, _ = W.cache_paths(path)
    cwasm.write_bytes(b"corrupt data")
    W.clear_memory_cache()
    loaded = W.load_module(path, POLICY)
    assert loaded.cache == "recompiled-corrupt"
    assert "unusable (not sealed by this installation)" in loaded.warnings[0]
    W.clear_memory_cache()
    assert W.load_module(path, POLICY).cache == "disk"  # rewritten


def test_it_reads_the_policy_from_config_toml(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[runtime.wasm]\nmemory_limit_mb = 8\nfuel_limit = 5000\nallowed_hosts = ["a.example"]\n'
                      'allowed_host_calls = ["az::az_env_get"]\n[runtime.wasm.security]\nmodule_hash_policy = "enforce"\n')
    policy = W.policy_for(config)
    assert (policy.memory_limit_mb, policy.fuel_limit, policy.module_hash_policy) == (8, 5000, "enforce")
    assert policy.permits("az_env_get") and not policy.permits("az_http_get") and policy.permits("az_log")
    assert policy.host_allowed("a.example") and not policy.host_allowed("b.example")


def test_it_keeps_the_last_good_policy_when_config_breaks(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[runtime.wasm]\nmemory_limit_mb = 8\n")
    cache = W.policy_cache(config)
    assert cache.get().memory_limit_mb == 8
    config.write_text('[runtime.wasm]\nmemory_limit_mb = "lots"\n')
    assert cache.get().memory_limit_mb == 8
    assert "memory_limit_mb must be a positive integer" in cache.error


def test_it_gates_wasi_filesystem_access_by_policy(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello wasi")
    (tmp_path / "secret.txt").write_text("outside")
    path = write_fixture(tmp_path / "mods", "wasi_fs")
    read_only = W.WasmPolicy(allow_workspace_read=True)
    read_write = W.WasmPolicy(allow_workspace_read=True, allow_workspace_write=True)
    cases = [
        (POLICY, b"ra.txt", b"errno:08"),  # nothing pre-opened: every filesystem call fails (EBADF)
        (read_only, b"ra.txt", b"hello wasi"),
        (read_only, b"wb.txt", b"errno:63"),  # read-only pre-open refuses writes (EPERM)
        (read_only, b"r../secret.txt", b"errno:63"),  # no escape from the pre-opened directory
        (read_write, b"wb.txt", b"ok"),
    ]
    for policy, data, expected in cases:
        logs = []
        assert run(path, data, policy, wasi_dir=workspace, on_log=logs.append).output == expected, (policy, data)
        assert logs == ["wasi says hi"]  # the guest's WASI stderr joins the log stream
    assert (workspace / "b.txt").read_text() == "written"


def test_it_reads_az_tool_schema_when_exported(tmp_path):
    schema = '{"type":"object","properties":{"city":{"type":"string"}}}'
    escaped = schema.replace('"', '\\"')
    wat = f"""(module
      (memory (export "memory") 1)
      (data (i32.const 100) "weather")
      (data (i32.const 200) "{escaped}")
      (func (export "az_alloc") (param i32) (result i32) (i32.const 4096))
      (func (export "az_tool_name") (result i64) (i64.or (i64.const 100) (i64.shl (i64.const 7) (i64.const 32))))
      (func (export "az_tool_schema") (result i64)
        (i64.or (i64.const 200) (i64.shl (i64.const {len(schema)}) (i64.const 32))))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (i64.const 0)))"""
    path = tmp_path / "weather.wasm"
    path.write_bytes(compile_wat(wat))
    info = W.describe(path, POLICY)
    assert info["name"] == "weather"
    assert info["schema"] == {"type": "object", "properties": {"city": {"type": "string"}}}


def test_it_classifies_a_stack_overflow_as_a_trap(tmp_path):
    wat = """(module
      (memory (export "memory") 1)
      (func $deep (param i32) (result i32) (call $deep (i32.add (local.get 0) (i32.const 1))))
      (func (export "az_alloc") (param i32) (result i32) (i32.const 16))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (drop (call $deep (i32.const 0))) (i64.const 0)))"""
    path = tmp_path / "deep.wasm"
    path.write_bytes(compile_wat(wat))
    assert "stack" in fails(path, W.TRAP).lower()


def test_it_runs_concurrent_calls_with_their_own_deadlines(tmp_path):
    reflect = write_fixture(tmp_path, "reflect")
    loop = write_fixture(tmp_path, "loop")
    results, errors = [], []

    def echo(n):
        for i in range(20):
            data = f'{{"n":{n},"i":{i}}}'.encode()
            results.append(run(reflect, data).output == data)

    def spin():
        try:
            run(loop, timeout_secs=0.2)
        except W.WasmError as exc:
            errors.append(exc.kind)

    threads = [threading.Thread(target=echo, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=spin) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 80  # a spinning neighbour's deadline never interrupts other calls
    assert errors == [P.TIMEOUT, P.TIMEOUT]


def test_it_stops_a_start_function_that_never_returns(tmp_path):
    wat = """(module
      (memory (export "memory") 1)
      (func $start (loop $l (br $l)))
      (start $start)
      (func (export "az_alloc") (param i32) (result i32) (i32.const 16))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (i64.const 0)))"""
    path = tmp_path / "start.wasm"
    path.write_bytes(compile_wat(wat))
    fails(path, P.TIMEOUT, timeout_secs=0.05)


def test_it_refuses_a_huge_function_table(tmp_path):
    wat = """(module
      (memory (export "memory") 1)
      (table 50000000 funcref)
      (func (export "az_alloc") (param i32) (result i32) (i32.const 16))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (i64.const 0)))"""
    path = tmp_path / "table.wasm"
    path.write_bytes(compile_wat(wat))
    assert "exceeds table limits" in fails(path, W.MEMORY_LIMIT)


def test_it_never_loads_a_native_cache_it_did_not_write(tmp_path):
    """A plugin package could ship .cache/ files: native code must only come from artefacts sealed by this host."""
    import hashlib

    good = write_fixture(tmp_path / "a", "echo", as_name="plugin")
    W.clear_memory_cache()
    W.load_module(good, POLICY)
    good_cwasm, _ = W.cache_paths(good)
    victim = tmp_path / "b" / "plugin.wasm"
    victim.parent.mkdir()
    victim.write_bytes(static_output_wasm({"output": "honest", "error": None}))
    cwasm, sha_file = W.cache_paths(victim)
    cwasm.parent.mkdir()
    forged = good_cwasm.read_bytes()  # native code of another module, with every checksum an attacker can compute
    cwasm.write_bytes(forged)
    sha_file.write_text(hashlib.sha256(victim.read_bytes()).hexdigest())
    cwasm.with_suffix(".cwasm.hmac").write_text(hashlib.sha256(forged).hexdigest())
    W.clear_memory_cache()
    assert W.load_module(victim, POLICY).cache == "recompiled-corrupt"
    assert run(victim).output == b'{"output": "honest", "error": null}'


def test_it_reports_a_wasi_proc_exit_clearly(tmp_path):
    wat = """(module (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "az_alloc") (param i32) (result i32) (i32.const 16))
      (func (export "az_tool_execute") (param i32 i32) (result i64) (call $exit (i32.const 3)) (i64.const 0)))"""
    path = tmp_path / "exit.wasm"
    path.write_bytes(compile_wat(wat))
    assert "proc_exit(3)" in fails(path, W.TRAP)
