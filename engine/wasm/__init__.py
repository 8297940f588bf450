"""The `wasm` runtime: WebAssembly modules run in-process under wasmtime, speaking AgentZero's ABI v2.

Every call gets a fresh Store and instance from a compiled module cached in memory and on disk. Host functions are
linked only when the plugin declares them AND the service's isolation policy allows them; anything else is refused
before instantiation with a clear message. Time, memory and module size are limited; every violation is a classified
failure, never an exception out of this package.

Its modules, one line each: docs/architecture.md, "Module map". The names below are the package's public surface;
the modules hold the rest.
"""

from engine.wasm.abi import (
    ABI_ERROR,
    FUEL_EXHAUSTED,
    HASH_MISMATCH,
    IMPORT_DENIED,
    MEMORY_LIMIT,
    MODULE_INVALID,
    MODULE_TOO_LARGE,
    TRAP,
    WasmError,
    pack,
    unpack,
)
from engine.wasm.compile_cache import cache_paths, clear_memory_cache, get_engine, load_module
from engine.wasm.execution import Execution, decode_output, describe, execute, static_check
from engine.wasm.hooks import WASM, WasmRuntime, check_plugin, run_wasm_hook
from engine.wasm.policy import WasmPolicy, policy_cache, policy_error, policy_for, policy_from_toml
from engine.wasm.wat import SCAFFOLD_REPLIES, hook_wat

__all__ = [
    "ABI_ERROR", "FUEL_EXHAUSTED", "WASM", "WasmRuntime", "HASH_MISMATCH", "IMPORT_DENIED", "MEMORY_LIMIT", "MODULE_INVALID",
    "MODULE_TOO_LARGE", "SCAFFOLD_REPLIES", "TRAP", "Execution", "WasmError", "WasmPolicy", "cache_paths",
    "check_plugin", "clear_memory_cache", "decode_output", "describe", "execute", "get_engine", "hook_wat",
    "load_module", "pack", "policy_cache", "policy_error", "policy_for", "policy_from_toml", "run_wasm_hook", "static_check",
    "unpack",
]
