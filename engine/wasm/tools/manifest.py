"""AgentZero-style WASM tool plugins: manifest.json, its rules, and the package format (a tar of manifest + module)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.errors import ServiceError

RUNTIME_API = 2
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
STATE_FILE = "plugin-state.json"
LOCK_FILE = ".agentzero-plugins.lock"
MAX_PACKAGE_BYTES = 64 * 1024 * 1024


class ToolError(ServiceError):
    """A refused tool operation (engine/errors.py); most are a 400 `invalid_tool`."""

    def __init__(self, message: str, code: str = "invalid_tool", status: int = 400):
        super().__init__(code, message, status)


class Dependency(BaseModel):
    id: str
    version_req: str = "*"


class ToolManifest(BaseModel):
    """AgentZero's manifest.json (`PluginManifest`); unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    id: str
    version: str
    description: str | None = None
    entrypoint: str
    wasm_file: str
    wasm_sha256: str
    capabilities: list[str] = Field(default_factory=list)
    hooks: list[str] = Field(default_factory=list)
    min_runtime_api: int = 2
    max_runtime_api: int = 2
    allowed_host_calls: list[str]  # required, as in AgentZero (serde has no default)
    dependencies: list[Dependency] = Field(default_factory=list)
    signature: str | None = None
    signing_key_id: str | None = None

    def check(self) -> None:
        """AgentZero's validate() rules and messages, plus safe path components for id, version and wasm_file."""
        if not self.id.strip():
            raise ToolError("plugin id cannot be empty")
        if not ID_RE.match(self.id):
            raise ToolError(f"plugin id {self.id!r} must be lowercase letters, digits, '-' or '_' (max 64)")
        if not self.version.strip():
            raise ToolError("plugin version cannot be empty")
        if not VERSION_RE.match(self.version) or ".." in self.version:
            raise ToolError(f"plugin version {self.version!r} is not a valid version")
        if not self.entrypoint.strip():
            raise ToolError("plugin entrypoint cannot be empty")
        if not self.wasm_file.strip() or not self.wasm_file.endswith(".wasm"):
            raise ToolError("plugin wasm_file must end with .wasm")
        if "/" in self.wasm_file or "\\" in self.wasm_file or self.wasm_file.startswith("."):
            raise ToolError("plugin wasm_file must be a plain file name inside the package")
        if not HEX64.match(self.wasm_sha256):
            raise ToolError("plugin wasm_sha256 must be a 64-char hex digest")
        if self.min_runtime_api < 1 or self.max_runtime_api < 1 or self.min_runtime_api > self.max_runtime_api:
            raise ToolError("plugin runtime API range is invalid (need 1 <= min_runtime_api <= max_runtime_api)")
        if not self.min_runtime_api <= RUNTIME_API <= self.max_runtime_api:
            raise ToolError(f"plugin runtime API compatibility failed: current={RUNTIME_API}, "
                            f"supported={self.min_runtime_api}..={self.max_runtime_api}"
                            + (" (ABI v1 plugins must be rebuilt with SDK v2)" if self.max_runtime_api < 2 else ""))


def parse_manifest(data: bytes | str | dict) -> ToolManifest:
    """Parse and validate manifest.json; raises ToolError with a readable message."""
    try:
        raw = data if isinstance(data, dict) else json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ToolError(f"manifest.json is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ToolError("manifest.json must be a JSON object")
    try:
        manifest = ToolManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise ToolError(f"manifest.json `{loc}`: {first.get('msg')}") from exc
    manifest.check()
    return manifest


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- package ----------------------------------------------------------------------------------------------------

def package(manifest: dict | bytes | str, wasm: bytes) -> bytes:
    """A tar with manifest.json (wasm_sha256 recomputed) and the module, both 0644, as AgentZero packages."""
    raw = manifest if isinstance(manifest, dict) else _json_object(manifest)
    raw = {**raw, "wasm_sha256": sha256_hex(wasm)}
    parsed = parse_manifest(raw)
    body = json.dumps(raw, indent=2, ensure_ascii=False).encode("utf-8")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("manifest.json", body), (parsed.wasm_file, wasm)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _json_object(data: bytes | str) -> dict:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ToolError(f"manifest.json is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ToolError("manifest.json must be a JSON object")
    return raw
