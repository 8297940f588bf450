"""The scaffold for `runtime = "wasm"`: WAT sources and their compiled modules (engine/wasm/wat.py writes the
fixed-reply ones)."""

from __future__ import annotations

from engine import hooks as H
from engine.plugins.scaffold import ScaffoldError, ScaffoldPlan, manifest_text
from engine.plugins.scaffold_templates import SHAPES, result_for

# An ABI v2 module that answers {"type": "<hook>_result", "messages": <the request's messages array>, ...}: it copies
# the raw JSON array found after the first `"messages":` key (string-aware bracket matching), so the assemble and
# compact templates pass the engine's checks without a JSON library inside the module.
_WASM_ECHO = """;; {hook}: request {request}; reply {reply_shape}.
;; Build: python -c "import wasmtime,sys; open(sys.argv[2],'wb').write(wasmtime.wat2wasm(open(sys.argv[1]).read()))" \\
;;   {hook}.wat {hook}.wasm
(module
  (import "az" "az_log" (func $az_log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const {heap}))
  (data (i32.const 1024) "\\"messages\\":")
  (data (i32.const 1040) "[]")
  (data (i32.const {prefix_at}) "{prefix}")
  (data (i32.const {suffix_at}) "{suffix}")
  (data (i32.const {msg_at}) "{msg}")
  (func $alloc (export "az_alloc") (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (block $fits
      (loop $grow
        (br_if $fits (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
        (if (i32.lt_s (memory.grow (i32.const 1)) (i32.const 0)) (then unreachable))
        (br $grow)))
    (local.get $ptr))
  ;; the offset just after the first `"messages":` in [ptr, ptr+len), or -1
  (func $find (param $ptr i32) (param $len i32) (result i32)
    (local $i i32) (local $j i32) (local $last i32)
    (if (i32.lt_u (local.get $len) (i32.const 11)) (then (return (i32.const -1))))
    (local.set $last (i32.add (local.get $ptr) (i32.sub (local.get $len) (i32.const 11))))
    (local.set $i (local.get $ptr))
    (block $none
      (loop $scan
        (br_if $none (i32.gt_u (local.get $i) (local.get $last)))
        (local.set $j (i32.const 0))
        (block $differs
          (loop $cmp
            (br_if $differs (i32.ne (i32.load8_u (i32.add (local.get $i) (local.get $j)))
                                    (i32.load8_u (i32.add (i32.const 1024) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $cmp (i32.lt_u (local.get $j) (i32.const 11))))
          (return (i32.add (local.get $i) (i32.const 11))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (i32.const -1))
  ;; $p points at '[': the offset just after its matching ']', or -1
  (func $array_end (param $p i32) (param $limit i32) (result i32)
    (local $depth i32) (local $in_string i32) (local $escaped i32) (local $c i32)
    (block $bad
      (loop $walk
        (br_if $bad (i32.ge_u (local.get $p) (local.get $limit)))
        (local.set $c (i32.load8_u (local.get $p)))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (if (local.get $in_string)
          (then
            (if (local.get $escaped)
              (then (local.set $escaped (i32.const 0)))
              (else
                (if (i32.eq (local.get $c) (i32.const 92)) (then (local.set $escaped (i32.const 1))))
                (if (i32.eq (local.get $c) (i32.const 34)) (then (local.set $in_string (i32.const 0)))))))
          (else
            (if (i32.eq (local.get $c) (i32.const 34)) (then (local.set $in_string (i32.const 1))))
            (if (i32.eq (local.get $c) (i32.const 91)) (then (local.set $depth (i32.add (local.get $depth) (i32.const 1)))))
            (if (i32.eq (local.get $c) (i32.const 93))
              (then
                (local.set $depth (i32.sub (local.get $depth) (i32.const 1)))
                (if (i32.eqz (local.get $depth)) (then (return (local.get $p))))))))
        (br $walk)))
    (i32.const -1))
  (func (export "az_tool_execute") (param $ptr i32) (param $len i32) (result i64)
    (local $start i32) (local $end i32) (local $limit i32) (local $c i32) (local $n i32) (local $out i32)
    (local $total i32)
    (call $az_log (i32.const 2) (i32.const {msg_at}) (i32.const {msg_len}))
    (local.set $limit (i32.add (local.get $ptr) (local.get $len)))
    (local.set $end (i32.const -1))
    (local.set $start (call $find (local.get $ptr) (local.get $len)))
    (if (i32.ge_s (local.get $start) (i32.const 0))
      (then
        (block $text
          (loop $skip_space
            (br_if $text (i32.ge_u (local.get $start) (local.get $limit)))
            (local.set $c (i32.load8_u (local.get $start)))
            (br_if $text (i32.eqz (i32.or (i32.or (i32.eq (local.get $c) (i32.const 32)) (i32.eq (local.get $c) (i32.const 9)))
                                          (i32.or (i32.eq (local.get $c) (i32.const 10)) (i32.eq (local.get $c) (i32.const 13))))))
            (local.set $start (i32.add (local.get $start) (i32.const 1)))
            (br $skip_space)))
        (if (i32.lt_u (local.get $start) (local.get $limit))
          (then (if (i32.eq (i32.load8_u (local.get $start)) (i32.const 91))
            (then (local.set $end (call $array_end (local.get $start) (local.get $limit)))))))))
    (if (i32.lt_s (local.get $end) (i32.const 0))
      (then (local.set $start (i32.const 1040)) (local.set $end (i32.const 1042))))
    (local.set $n (i32.sub (local.get $end) (local.get $start)))
    (local.set $total (i32.add (i32.add (i32.const {prefix_len}) (local.get $n)) (i32.const {suffix_len})))
    (local.set $out (call $alloc (local.get $total)))
    (memory.copy (local.get $out) (i32.const {prefix_at}) (i32.const {prefix_len}))
    (memory.copy (i32.add (local.get $out) (i32.const {prefix_len})) (local.get $start) (local.get $n))
    (memory.copy (i32.add (i32.add (local.get $out) (i32.const {prefix_len})) (local.get $n)) (i32.const {suffix_at})
                 (i32.const {suffix_len}))
    (i64.or (i64.extend_i32_u (local.get $out)) (i64.shl (i64.extend_i32_u (local.get $total)) (i64.const 32)))))
"""
_WASM_ECHO_PARTS = {
    H.ASSEMBLE: ('{"type":"assemble_result","messages":', "}"),
    H.COMPACT: ('{"type":"compact_result","messages":', ',"summary":"this template keeps every message"}'),
}


def wasm_echo_wat(hook: str, log_line: str) -> str:
    from engine.wasm.wat import wat_string

    prefix, suffix = (p.encode() for p in _WASM_ECHO_PARTS[hook])
    msg = log_line.encode("utf-8")
    prefix_at = 1056
    suffix_at = prefix_at + len(prefix) + 16
    msg_at = suffix_at + len(suffix) + 16
    heap = (msg_at + len(msg) + 15) // 16 * 16 + 16
    request, reply_shape = SHAPES[hook]
    return _WASM_ECHO.format(hook=hook, request=request, reply_shape=reply_shape, heap=heap, prefix_at=prefix_at,
                             prefix=wat_string(prefix), prefix_len=len(prefix), suffix_at=suffix_at,
                             suffix=wat_string(suffix), suffix_len=len(suffix), msg_at=msg_at,
                             msg=wat_string(msg), msg_len=len(msg))


def wasm_plan(name: str, description: str, author: str, chosen: list[str], written: list[str]) -> ScaffoldPlan:
    try:
        import wasmtime

        from engine import wasm
    except ImportError as exc:
        raise ScaffoldError("runtime_not_scaffoldable", "the wasm runtime is not available in this build") from exc
    files: dict[str, bytes] = {}
    hook_files: dict[str, str] = {}
    for hook in written:
        log_line = f"{name}: {hook} called"
        wat = wasm_echo_wat(hook, log_line) if hook in _WASM_ECHO_PARTS else wasm.hook_wat(log_line, result_for(hook))
        files[f"hooks/{hook}.wat"] = wat.encode("utf-8")
        files[f"hooks/{hook}.wasm"] = bytes(wasmtime.wat2wasm(wat))
        hook_files[hook] = f"hooks/{hook}.wasm"
    text = manifest_text(name, description, "wasm", hook_files, chosen, author)
    text += ("\n# Host calls beyond az_log need a capability here AND the service policy\n"
             "# ([runtime.wasm] allowed_host_calls in config.toml), e.g. \"host:az_env_get\";\n"
             "# az_http_get also needs allow_network = true in [hooks] and the host in allowed_hosts.\n"
             "[wasm]\ncapabilities = []\n")
    files["plugin.toml"] = text.encode("utf-8")
    return ScaffoldPlan("wasm", files, set())
