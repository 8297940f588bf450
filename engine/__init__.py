"""The hook engine: pure Python (stdlib + pydantic + wasmtime). No Django, no Redis — side effects come in
through `engine.ports`."""
