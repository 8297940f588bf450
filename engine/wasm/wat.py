"""A working wasm hook module from WAT, for the scaffold (engine/plugins/scaffold.py builds the plugin around it)."""

from __future__ import annotations

import json
from typing import Any

# The constant replies of the scaffolded modules (engine/plugins/scaffold.py builds the plugin; its assemble and compact
# modules echo the request's messages instead, since an empty list makes every agent call fall back).
SCAFFOLD_REPLIES = {
    "ingest": {"type": "ingest_result", "memories": []},
    "assemble": {"type": "assemble_result", "messages": []},
    "compact": {"type": "compact_result", "messages": []},
    "after_turn": {"type": "ok"},
    "bootstrap": {"type": "ok"},
    "prepare_subagent": {"type": "ok"},
    "merge_subagent": {"type": "ok"},
    "transform_tool_result": {"type": "skip"},
    "on_event": {"type": "ok"},
}


def wat_string(data: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02x}" for b in data)


def hook_wat(log_line: str, reply: Any) -> str:
    """WAT for an ABI v2 module that logs one line through az_log and returns a fixed JSON reply."""
    out = json.dumps(reply, separators=(",", ":")).encode("utf-8")
    msg = log_line.encode("utf-8")
    out_at, msg_at = 1024, 1024 + len(out) + 16
    heap = (msg_at + len(msg) + 15) // 16 * 16 + 16
    return f""";; ABI v2 hook module (AgentZero-compatible). Build: python -c "import wasmtime,sys;
;; open(sys.argv[2],'wb').write(wasmtime.wat2wasm(open(sys.argv[1]).read()))" hook.wat hook.wasm
;; Input: the hook request JSON at (ptr, len). Output: packed ptr | len << 32 of the reply JSON.
(module
  (import "az" "az_log" (func $az_log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const {heap}))
  (data (i32.const {out_at}) "{wat_string(out)}")
  (data (i32.const {msg_at}) "{wat_string(msg)}")
  ;; bump allocator: never frees; the instance is dropped after each call
  (func (export "az_alloc") (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $size)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.lt_s (memory.grow (i32.const 1)) (i32.const 0)) (then unreachable))))
    (local.get $ptr))
  (func (export "az_tool_execute") (param $ptr i32) (param $len i32) (result i64)
    (call $az_log (i32.const 2) (i32.const {msg_at}) (i32.const {len(msg)}))
    (i64.or (i64.const {out_at}) (i64.shl (i64.const {len(out)}) (i64.const 32)))))
"""
