"""AgentZero-style WASM tool plugins: manifest.json, package/install, state file, discovery and execution.

Layout: `$LIBREFANG_HOME/tools/<id>/<version>/{manifest.json,<wasm_file>}`; the state file
`$LIBREFANG_HOME/tools/plugin-state.json` (`{"plugins": {id: {version, enabled, installed_at, source}}}`, a missing
entry = enabled); an exclusive lock `tools/.agentzero-plugins.lock` around install/remove/state changes.

`module_hash_policy` (config `[runtime.wasm.security]`), checked every time a tool runs (AgentZero only checks at
install; its key is config-only there): "warn" = the module's sha256 differs from the manifest's `wasm_sha256`: run it,
and report a warning in the reply and the log; "enforce" = refuse to run (failure `wasm_hash_mismatch`); "skip" = no
check. Install always refuses a mismatch.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import tarfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import protocol as P
from engine import wasm as W
from engine.home import Home

RUNTIME_API = 2
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
STATE_FILE = "plugin-state.json"
LOCK_FILE = ".agentzero-plugins.lock"
MAX_PACKAGE_BYTES = 64 * 1024 * 1024


class ToolError(Exception):
    """A refused tool operation. `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, code: str = "invalid_tool", status: int = 400):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


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


# ---- install / remove / state -----------------------------------------------------------------------------------

@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# Unpacking limits, checked against each member's declared size BEFORE its bytes are read, and against what is
# actually decompressed (a header can only claim what the stream then has to deliver): a small gzip bomb is refused
# after its first header, and memory stays at one copy buffer whatever the archive holds.
MAX_MEMBERS = 64
MAX_MANIFEST_BYTES = 1024 * 1024
UNPACK_SLACK_BYTES = 8 * 1024 * 1024  # everything besides the module: manifest, README, tar headers
COPY_CHUNK = 1024 * 1024
_CODEC_ERRORS = (zlib.error, lzma.LZMAError)  # corrupt compressed data (gzip/bz2 raise OSError or EOFError)
INCOMING_DIR = ".incoming"  # staging under tools/ (hidden from discovery: it starts with a dot)


def unpacked_limit(policy: W.WasmPolicy) -> int:
    """The most a package may expand to: the module size policy plus a little for the rest."""
    return policy.max_module_bytes + UNPACK_SLACK_BYTES


class _Capped(io.RawIOBase):
    """A reader over the decompressed stream that refuses to deliver more than `limit` bytes in total."""

    def __init__(self, raw, limit: int):
        super().__init__()
        self.raw, self.limit, self.count = raw, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(min(len(buffer), self.limit - self.count + 1))
        self.count += len(data)
        if self.count > self.limit:
            raise ToolError(f"package expands to more than {self.limit} bytes", code="payload_too_large",
                            status=413)
        buffer[:len(data)] = data
        return len(data)


def _decompressed(fh) -> Any:
    """The archive's bytes, decompressed on the fly (gzip, bzip2, xz or plain tar), chosen by the magic bytes."""
    import bz2
    import gzip

    magic = fh.read(6)
    fh.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=fh, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(fh, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(fh, mode="rb")
    return fh


def _check_member(member: tarfile.TarInfo, seen: int, total: int, policy: W.WasmPolicy) -> str | None:
    """The clean name of a member to extract (a plain top-level file), None to skip it; ToolError to refuse."""
    name = member.name
    if seen > MAX_MEMBERS:
        raise ToolError(f"package has more than {MAX_MEMBERS} entries", code="payload_too_large", status=413)
    if member.issym() or member.islnk():
        raise ToolError(f"plugin package contains a symlink entry `{name}` (rejected for security)")
    if name.startswith("/") or ".." in name or "\\" in name:
        raise ToolError(f"path traversal in plugin package: `{name}` (rejected for security)")
    if member.isdir():
        return None
    if not member.isfile() or member.issparse():
        raise ToolError(f"plugin package entry `{name}` is not a regular file (rejected for security)")
    if member.size > policy.max_module_bytes:
        raise ToolError(f"package entry `{name}` declares {member.size} bytes, more than the module size policy "
                        f"({policy.max_module_bytes} bytes)", code="payload_too_large", status=413)
    limit = unpacked_limit(policy)
    if total > limit:
        raise ToolError(f"package expands to more than {limit} bytes (entry `{name}` declares {member.size})",
                        code="payload_too_large", status=413)
    clean = name[2:] if name.startswith("./") else name
    if clean == "manifest.json" and member.size > MAX_MANIFEST_BYTES:
        raise ToolError(f"manifest.json is larger than {MAX_MANIFEST_BYTES} bytes", code="payload_too_large",
                        status=413)
    return clean if clean and "/" not in clean else None  # only top-level files can be the manifest or module


# GNU long names and pax headers: tarfile reads their data whole into memory before it hands out the member.
EXTENDED_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                  tarfile.SOLARIS_XHDTYPE)
MAX_EXTENDED_BYTES = 64 * 1024


def _scan_headers(archive: Path, policy: W.WasmPolicy) -> None:
    """A first pass over the raw 512-byte tar headers, before tarfile parses anything: the declared size of every
    entry (extended headers included), the entry count and the running total, skipping data chunk by chunk. A
    malformed or truncated archive ends the scan quietly: the extracting pass reports it as tarfile sees it."""
    limit = unpacked_limit(policy)
    headers = total = 0
    with open(archive, "rb") as fh:
        stream = _decompressed(fh)
        try:
            while len(block := stream.read(512)) == 512 and block != bytes(512):
                try:
                    size = tarfile.nti(block[124:136])
                except tarfile.InvalidHeaderError:
                    return
                name = block[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
                headers += 1
                if headers > 3 * MAX_MEMBERS:  # each entry may come with a long-name and a pax header
                    raise ToolError(f"package has more than {MAX_MEMBERS} entries", code="payload_too_large",
                                    status=413)
                if block[156:157] in EXTENDED_TYPES:
                    if size > MAX_EXTENDED_BYTES:
                        raise ToolError(f"package has a {size}-byte extended (long name or pax) header; at most "
                                        f"{MAX_EXTENDED_BYTES} bytes are accepted", code="payload_too_large",
                                        status=413)
                elif size > policy.max_module_bytes:
                    raise ToolError(f"package entry `{name}` declares {size} bytes, more than the module size "
                                    f"policy ({policy.max_module_bytes} bytes)", code="payload_too_large", status=413)
                total += size
                if total > limit:
                    raise ToolError(f"package expands to more than {limit} bytes (entry `{name}` declares {size})",
                                    code="payload_too_large", status=413)
                left = size + (-size % 512)
                while left > 0 and (chunk := stream.read(min(left, COPY_CHUNK))):
                    left -= len(chunk)
        except (EOFError, OSError, *_CODEC_ERRORS):
            return


def unpack_package(archive: Path, dest: Path, policy: W.WasmPolicy) -> dict[str, str]:
    """Stream-extract a package's top-level files into `dest` (created, 0700) under the limits above; returns
    {name: sha256}. Refuses links, devices, `..` and absolute paths, and anything over the limits, before
    extracting the offending member. On error `dest` may hold partial files: the caller removes it."""
    if archive.stat().st_size > MAX_PACKAGE_BYTES:
        raise ToolError(f"package is larger than {MAX_PACKAGE_BYTES} bytes", status=413, code="payload_too_large")
    _scan_headers(archive, policy)
    dest.mkdir(parents=True, mode=0o700)
    files: dict[str, str] = {}
    seen = total = 0
    with open(archive, "rb") as fh:
        stream = io.BufferedReader(_Capped(_decompressed(fh), unpacked_limit(policy) + MAX_MEMBERS * 3 * 512))
        try:
            tar = tarfile.open(fileobj=stream, mode="r|")  # noqa: SIM115 (closed by the with below)
        except (tarfile.TarError, EOFError, OSError, *_CODEC_ERRORS) as exc:
            raise ToolError(f"package is not a tar archive: {exc}") from exc
        with tar:
            try:
                for member in tar:
                    seen += 1
                    total += member.size
                    clean = _check_member(member, seen, total, policy)
                    if clean is None:
                        continue
                    files[clean] = _copy_member(tar, member, dest / clean)
            except ToolError:
                raise
            except (tarfile.TarError, EOFError, OSError, *_CODEC_ERRORS) as exc:
                raise ToolError(f"package is not a valid tar archive: {exc}") from exc
    return files


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> str:
    source = tar.extractfile(member)
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        while source is not None and (chunk := source.read(COPY_CHUNK)):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def fetch_package_to(url: str, target: Path, expected_sha256: str | None = None, timeout: float = 30.0) -> None:
    """Copy a package from `file://`, `http://` or `https://` (AgentZero's install --url) into `target`, at most
    MAX_PACKAGE_BYTES, checked against `expected_sha256` (the sha of the tar bytes) when given. Raises ToolError."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    try:
        if parts.scheme == "file":
            try:
                source = open(urllib.parse.unquote(parts.path), "rb")  # noqa: SIM115 (closed below)
            except OSError as exc:
                raise ToolError(f"cannot read {url}: {exc.strerror or exc}") from exc
        elif parts.scheme in ("http", "https"):
            try:
                source = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310, SIM115 (owner-supplied URL)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                raise ToolError(f"cannot download {url}: {exc}", code="download_failed", status=502) from exc
        else:
            raise ToolError(f"unsupported URL scheme for '{url}'. Use 'https://', 'http://', or 'file://'")
        digest, size = hashlib.sha256(), 0
        with source, open(target, "wb") as out:
            while chunk := source.read(COPY_CHUNK):
                size += len(chunk)
                if size > MAX_PACKAGE_BYTES:
                    raise ToolError(f"package is larger than {MAX_PACKAGE_BYTES} bytes", status=413,
                                    code="payload_too_large")
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise ToolError(f"cannot download {url}: {exc}", code="download_failed", status=502) from exc
    if expected_sha256:
        actual = digest.hexdigest()
        if actual != expected_sha256.strip().lower():
            raise ToolError(f"SHA256 mismatch: expected {expected_sha256.strip().lower()}, got {actual}")


def fetch_package(url: str, expected_sha256: str | None = None, timeout: float = 30.0) -> bytes:
    """fetch_package_to, as bytes (for small packages and tests)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "package"
        fetch_package_to(url, target, expected_sha256, timeout)
        return target.read_bytes()


def incoming_dir(home: Home) -> Path:
    """Where uploaded packages wait for a worker and get unpacked (owner-only)."""
    path = home.tools_dir / INCOMING_DIR
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


@dataclass
class InstalledTool:
    id: str
    version: str
    dir: Path
    manifest: ToolManifest | None
    problems: list[str] = field(default_factory=list)
    enabled: bool = True
    installed_at: str | None = None
    source: str | None = None

    @property
    def wasm_path(self) -> Path | None:
        return self.dir / self.manifest.wasm_file if self.manifest else None


def install(home: Home, data: bytes, source: str = "local", policy: W.WasmPolicy | None = None) -> InstalledTool:
    """install_file for a package held in memory."""
    if len(data) > MAX_PACKAGE_BYTES:
        raise ToolError(f"package is larger than {MAX_PACKAGE_BYTES} bytes", status=413, code="payload_too_large")
    archive = incoming_dir(home) / f"mem-{uuid.uuid4().hex}.pkg"
    try:
        archive.write_bytes(data)
        return install_file(home, archive, source, policy)
    finally:
        archive.unlink(missing_ok=True)


def install_file(home: Home, archive: Path, source: str = "local",
                 policy: W.WasmPolicy | None = None) -> InstalledTool:
    """Install the package at `archive` under tools/<id>/<version>/ (replacing that version) and record it
    enabled. Unpacks under the limits of unpack_package into a staging directory; nothing is left behind on error."""
    policy = policy or W.WasmPolicy()
    root = home.tools_dir
    staging = incoming_dir(home) / f"unpack-{uuid.uuid4().hex}"
    try:
        files = unpack_package(archive, staging, policy)
        if "manifest.json" not in files:
            raise ToolError("package missing manifest.json")
        manifest_bytes = (staging / "manifest.json").read_bytes()
        manifest = parse_manifest(manifest_bytes)
        if manifest.wasm_file not in files:
            raise ToolError(f"package missing wasm module `{manifest.wasm_file}`")
        if files[manifest.wasm_file] != manifest.wasm_sha256.lower():
            raise ToolError(f"integrity check failed for `{manifest.wasm_file}`: checksum mismatch")
        wasm_path = staging / manifest.wasm_file
        size = wasm_path.stat().st_size
        if size > policy.max_module_bytes:
            raise ToolError(f"plugin module exceeds size policy ({size} > {policy.max_module_bytes} bytes)")
        try:
            W.wasmtime.Module.validate(W.get_engine(), wasm_path.read_bytes())
        except W.wasmtime.WasmtimeError as exc:
            raise ToolError(f"`{manifest.wasm_file}` is not a valid wasm module: {W._first_line(exc)}") from exc
        with _locked(root):
            target = root / manifest.id / manifest.version
            tmp = root / manifest.id / f".tmp-{manifest.version}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            (staging / "manifest.json").rename(tmp / "manifest.json")
            wasm_path.rename(tmp / manifest.wasm_file)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
            state = load_state(home)
            state.setdefault("plugins", {})[manifest.id] = {"version": manifest.version, "enabled": True,
                                                             "installed_at": str(int(time.time())), "source": source}
            _save_state(home, state)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return get_tool(home, manifest.id)


def remove(home: Home, tool_id: str, version: str | None = None) -> int:
    """Remove one version (or all); the number of version directories removed."""
    if not tool_id.strip():
        raise ToolError("plugin id cannot be empty")
    if not ID_RE.match(tool_id) or (version is not None and (not VERSION_RE.match(version) or ".." in version)):
        raise ToolError(f"unknown tool {tool_id!r}", code="not_found", status=404)
    root = home.tools_dir
    with _locked(root):
        base = root / tool_id
        if not base.is_dir():
            return 0
        dirs = [base / version] if version else [d for d in base.iterdir() if d.is_dir()]
        count = 0
        for d in dirs:
            if d.is_dir():
                shutil.rmtree(d)
                count += 1
        if base.is_dir() and not any(base.iterdir()):
            base.rmdir()
        if not base.exists():
            state = load_state(home)
            state.get("plugins", {}).pop(tool_id, None)
            _save_state(home, state)
        return count


def load_state(home: Home) -> dict[str, Any]:
    """The state file; missing or unreadable gives an empty state (everything enabled)."""
    try:
        data = json.loads((home.tools_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {"plugins": {}}
    if not isinstance(data, dict) or not isinstance(data.get("plugins"), dict):
        return {"plugins": {}}
    return data


def _save_state(home: Home, state: dict[str, Any]) -> None:
    path = home.tools_dir / STATE_FILE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(path)


def set_enabled(home: Home, tool_id: str, enabled: bool) -> InstalledTool:
    tool = get_tool(home, tool_id)
    with _locked(home.tools_dir):
        state = load_state(home)
        entry = state.setdefault("plugins", {}).get(tool_id)
        if entry is None:  # installed by copying files: create the entry rather than fail like AgentZero
            entry = {"version": tool.version, "installed_at": None, "source": "manual"}
            state["plugins"][tool_id] = entry
        entry["enabled"] = enabled
        _save_state(home, state)
    return get_tool(home, tool_id)


# ---- discovery ----------------------------------------------------------------------------------------------------

def _version_key(version: str) -> tuple:
    main = version.split("+")[0]
    core, _, pre = main.partition("-")
    parts = core.split(".")
    if all(p.isdigit() for p in parts):
        return (1, tuple(int(p) for p in parts), 0 if pre else 1, pre)
    return (0, (), 0, version)


def _load_dir(tool_id: str, version_dir: Path) -> InstalledTool:
    version = version_dir.name
    try:
        manifest = parse_manifest((version_dir / "manifest.json").read_bytes())
    except OSError as exc:
        return InstalledTool(tool_id, version, version_dir, None, [f"cannot read manifest.json: {exc}"])
    except ToolError as exc:
        return InstalledTool(tool_id, version, version_dir, None, [exc.message])
    problems = []
    if manifest.id != tool_id:
        problems.append(f"manifest id {manifest.id!r} does not match directory {tool_id!r}")
    if not (version_dir / manifest.wasm_file).is_file():
        problems.append(f"wasm file `{manifest.wasm_file}` is missing")
    return InstalledTool(tool_id, manifest.version, version_dir, manifest, problems)


def list_tools(home: Home) -> list[InstalledTool]:
    """Installed tools, the highest version of each (semver), with their state; sorted by id."""
    root = home.tools_dir
    if not root.is_dir():
        return []
    state = load_state(home).get("plugins", {})
    out = []
    for base in sorted(root.iterdir()):
        if not base.is_dir() or base.name.startswith(".") or not ID_RE.match(base.name):
            continue
        if (base / "manifest.json").is_file():  # flat layout (development)
            tool = _load_dir(base.name, base)
        else:
            versions = [d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")
                        and (d / "manifest.json").is_file()]
            if not versions:
                continue
            tool = _load_dir(base.name, max(versions, key=lambda d: _version_key(d.name)))
        entry = state.get(base.name) or {}
        tool.enabled = bool(entry.get("enabled", True))
        tool.installed_at = entry.get("installed_at")
        tool.source = entry.get("source")
        out.append(tool)
    return out


def get_tool(home: Home, tool_id: str) -> InstalledTool:
    for tool in list_tools(home):
        if tool.id == tool_id:
            return tool
    raise ToolError(f"unknown tool {tool_id!r}", code="not_found", status=404)


INFO_FILE = "tool-info.json"
_sha_cache: dict[tuple, str] = {}


def module_sha256(path: Path) -> str | None:
    """sha256 of a module file (hashing only, no code runs); cached by (path, mtime, size, inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
    sha = _sha_cache.get(key)
    if sha is None:
        try:
            sha = _sha_cache[key] = sha256_hex(path.read_bytes())
        except OSError:
            return None
    return sha


def info_path(tool: InstalledTool) -> Path:
    return tool.dir / ".cache" / INFO_FILE


def refresh_info(tool: InstalledTool, policy: W.WasmPolicy) -> dict[str, Any]:
    """Ask the module for az_tool_name/az_tool_schema (this RUNS module code: workers only) and store the answer
    next to it, keyed by the module's sha256, for readers that must not run plugin code (the web tier)."""
    if tool.manifest is None or tool.wasm_path is None:
        return {}
    try:
        meta = W.describe(tool.wasm_path, policy, tool.manifest.capabilities)
        info = {"sha256": meta["sha256"], "name": meta["name"], "schema": meta["schema"], "error": None}
    except W.WasmError as exc:
        info = {"sha256": module_sha256(tool.wasm_path), "name": None, "schema": None, "error": exc.message}
    path = info_path(tool)
    try:
        if not path.exists() or json.loads(path.read_text()) != info:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(info))
            tmp.replace(path)
    except (OSError, ValueError):
        pass
    return info


def _refresh_if_stale(tool: InstalledTool, sha: str, policy: W.WasmPolicy) -> None:
    try:
        stored = json.loads(info_path(tool).read_text())
    except (OSError, ValueError):
        stored = None
    if not isinstance(stored, dict) or stored.get("sha256") != sha:
        refresh_info(tool, policy)


def describe(tool: InstalledTool, policy: W.WasmPolicy) -> dict[str, Any]:
    """A JSON-able view of a tool for the API and dashboard. Runs no module code: the module's own name and schema
    come from what a worker stored (refresh_info) for the current module bytes."""
    m = tool.manifest
    info: dict[str, Any] = {
        "id": tool.id, "version": tool.version, "enabled": tool.enabled, "installed_at": tool.installed_at,
        "source": tool.source, "description": (m.description if m else None) or "",
        "capabilities": m.capabilities if m else [], "allowed_host_calls": m.allowed_host_calls if m else [],
        "wasm_file": m.wasm_file if m else None, "wasm_sha256": m.wasm_sha256 if m else None,
        "runtime_api": [m.min_runtime_api, m.max_runtime_api] if m else None,
        "module_name": None, "input_schema": None, "problems": list(tool.problems), "hash_ok": None,
    }
    if m is None or tool.problems or tool.wasm_path is None:
        return info
    sha = module_sha256(tool.wasm_path)
    info["hash_ok"] = sha == m.wasm_sha256.lower()
    if not info["hash_ok"]:
        info["problems"].append(f"module sha256 {str(sha)[:12]}… does not match the manifest "
                                f"(module_hash_policy = {policy.module_hash_policy})")
    try:  # compiles (cached), runs nothing: an undeclared or refused import shows here, not only when called
        W.static_check(tool.wasm_path, m.capabilities, policy)
    except W.WasmError as exc:
        info["problems"].append(exc.message)
    try:
        stored = json.loads(info_path(tool).read_text())
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict) and stored.get("sha256") == sha:
        info["module_name"] = stored.get("name")
        info["input_schema"] = stored.get("schema")
        if stored.get("error") and stored["error"] not in info["problems"]:
            info["problems"].append(stored["error"])
    return info


# ---- execute ------------------------------------------------------------------------------------------------------

@dataclass
class ToolRun:
    """One execution. `output`/`error` are the agent-facing result (AgentZero's WasmTool mapping)."""

    ok: bool
    output: str
    error: str | None
    kind: str | None = None  # failure kind when not ok
    warnings: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "output": self.output, "error": self.error, "kind": self.kind,
                "warnings": self.warnings, "logs": self.logs, "elapsed_ms": round(self.elapsed_ms, 3),
                "version": self.version}


def workspace_for(home: Home, policy: W.WasmPolicy) -> Path:
    return Path(policy.workspace_root).expanduser() if policy.workspace_root else home.root / "workspace"


def map_output(text: str) -> tuple[bool, str, str | None]:
    """AgentZero's output contract: {"output": str, "error": str|null}; (ok, output, error)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise W.WasmError(P.INVALID_OUTPUT, f"plugin output is not valid JSON: {exc} (raw: {text[:200]})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("output"), str):
        raise W.WasmError(P.INVALID_OUTPUT, f"plugin output is not valid JSON: missing field `output` "
                                            f"(raw: {text[:200]})")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        error = json.dumps(error)
    if error and not data["output"]:
        return False, "", f"plugin error: {error}"
    if error:
        return True, f"{data['output']}\n[plugin warning: {error}]", None
    return True, data["output"], None


def execute(home: Home, tool_id: str, input_text: str, *, policy: W.WasmPolicy | None = None,
            on_log: Callable[[str], None] | None = None, environ: dict[str, str] | None = None) -> ToolRun:
    """Run a tool once. Unknown/disabled tools raise ToolError; everything the module does is a ToolRun."""
    policy = policy or W.policy_for(home.config_path)
    tool = get_tool(home, tool_id)
    if not tool.enabled:
        raise ToolError(f"tool {tool_id!r} is disabled", code="tool_disabled", status=409)
    started = time.monotonic()
    logs: list[str] = []
    warnings: list[str] = []

    def log(line: str) -> None:
        logs.append(line)
        if on_log is not None:
            on_log(line)

    def failed(kind: str, message: str) -> ToolRun:
        return ToolRun(False, "", message, kind, warnings, logs, (time.monotonic() - started) * 1000, tool.version)

    if tool.manifest is None or tool.problems:
        return failed(P.MANIFEST_INVALID, "; ".join(tool.problems) or "tool cannot be loaded")
    manifest = tool.manifest
    try:
        compiled = W.load_module(tool.wasm_path, policy)
        if policy.module_hash_policy != "skip" and compiled.sha256 != manifest.wasm_sha256.lower():
            message = (f"module_hash_policy={policy.module_hash_policy}: sha256 of `{manifest.wasm_file}` is "
                       f"{compiled.sha256}, the manifest says {manifest.wasm_sha256.lower()}")
            if policy.module_hash_policy == "enforce":
                log(f"[ERROR] {message}; refused")
                return failed(W.HASH_MISMATCH, message + "; refused to run")
            warnings.append(message)
            log(f"[WARN] {message}; running anyway")
        _refresh_if_stale(tool, compiled.sha256, policy)
        workspace = workspace_for(home, policy)
        workspace.mkdir(parents=True, exist_ok=True)
        source_env = os.environ if environ is None else environ
        env = {k: source_env[k] for k in policy.allowed_env_vars if k in source_env}
        payload = json.dumps({"input": input_text, "workspace_root": str(workspace)}, ensure_ascii=False)
        run = W.execute(tool.wasm_path, payload.encode("utf-8"), policy=policy, capabilities=manifest.capabilities,
                        timeout_secs=policy.max_execution_ms / 1000, env=env, read_root=workspace, on_log=log,
                        wasi_dir=workspace)
        if not run.output:
            return failed(P.EMPTY_OUTPUT, "plugin error: plugin returned empty output")
        ok, output, error = map_output(W.decode_output(run.output))
    except W.WasmError as exc:
        return failed(exc.kind, exc.message)
    except Exception as exc:  # never let a module crash the worker
        return failed(W.TRAP, f"wasm runtime error: {type(exc).__name__}: {W._first_line(exc)}")
    elapsed = (time.monotonic() - started) * 1000
    return ToolRun(ok, output, error, None if ok else "plugin_error", warnings, logs, elapsed, tool.version)
