"""AgentZero's ABI v2 as this service speaks it: failure kinds, limits, WasmError and the packed pointer/length.

A module exports `memory`, `az_alloc(i32) -> i32` and `az_tool_execute(ptr, len) -> i64` (packed `ptr | len << 32`);
`az_tool_name`/`az_tool_schema` are read when present. Host functions live in import module `az`.
"""

from __future__ import annotations

import wasmtime

from engine import protocol as P
from engine.protocol import Failure

# ---- failure kinds specific to wasm (stable strings, like engine.protocol's) ----
MODULE_INVALID = "wasm_module_invalid"  # not a wasm module / does not compile
ABI_ERROR = "wasm_abi_error"  # a required export is missing or has the wrong type, or bad pointers
IMPORT_DENIED = "wasm_import_denied"  # imports a host call it did not declare or the policy refuses
MODULE_TOO_LARGE = "wasm_module_too_large"
MEMORY_LIMIT = "wasm_memory_limit"
FUEL_EXHAUSTED = "wasm_fuel_exhausted"
TRAP = "wasm_trap"
HASH_MISMATCH = "wasm_hash_mismatch"
# Time limit: P.TIMEOUT. Output problems: P.EMPTY_OUTPUT / P.INVALID_OUTPUT.

HOST_MODULE = "az"
WASI_MODULE = "wasi_snapshot_preview1"
HOST_CALLS = ("az_log", "az_env_get", "az_read_file", "az_http_get")
LOG_LEVELS = {0: "ERROR", 1: "WARN", 2: "INFO", 3: "DEBUG"}
OUTPUT_CAP_BYTES = P.STREAM_CAP_BYTES
HTTP_BODY_CAP_BYTES = 1024 * 1024
READ_FILE_CAP_BYTES = 1024 * 1024
LOG_LINE_CAP = 4096
MAX_LOG_LINES = 1000
PAGE = 65536
TICK_SECS = 0.002  # epoch granularity
NO_FUEL_LIMIT = 2**62
TABLE_ELEMENTS_LIMIT = 100_000  # function-table entries per table (a huge declared table would eat host memory)


class WasmError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def failure(self) -> Failure:
        return Failure(self.kind, self.message)


def pack(ptr: int, length: int) -> int:
    return (ptr & 0xFFFF_FFFF) | ((length & 0xFFFF_FFFF) << 32)


def unpack(packed: int) -> tuple[int, int]:
    packed &= 0xFFFF_FFFF_FFFF_FFFF  # i64 results arrive signed
    return packed & 0xFFFF_FFFF, (packed >> 32) & 0xFFFF_FFFF


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


I32 = wasmtime.ValType.i32()
I64 = wasmtime.ValType.i64()
def signature_matches(ty: wasmtime.FuncType, params: list, results: list) -> bool:
    return [str(p) for p in ty.params] == [str(p) for p in params] and \
        [str(r) for r in ty.results] == [str(r) for r in results]
