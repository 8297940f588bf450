"""Installing a tool package: fetched or uploaded, unpacked under limits into a staging directory, checked, then
moved into place. Install always refuses a module whose sha256 differs from the manifest's."""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import shutil
import tarfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import wasmtime

from engine.home import Home
from engine.wasm.abi import first_line
from engine.wasm.compile_cache import get_engine
from engine.wasm.policy import WasmPolicy
from engine.wasm.tools.installed import InstalledTool, get_tool, load_state, save_state, tools_locked
from engine.wasm.tools.manifest import MAX_PACKAGE_BYTES, ToolError, parse_manifest

# Unpacking limits, checked against each member's declared size BEFORE its bytes are read, and against what is
# actually decompressed (a header can only claim what the stream then has to deliver): a small gzip bomb is refused
# after its first header, and memory stays at one copy buffer whatever the archive holds.
MAX_MEMBERS = 64
MAX_MANIFEST_BYTES = 1024 * 1024
UNPACK_SLACK_BYTES = 8 * 1024 * 1024  # everything besides the module: manifest, README, tar headers
COPY_CHUNK = 1024 * 1024
_CODEC_ERRORS = (zlib.error, lzma.LZMAError)  # corrupt compressed data (gzip/bz2 raise OSError or EOFError)
INCOMING_DIR = ".incoming"  # staging under tools/ (hidden from discovery: it starts with a dot)


def unpacked_limit(policy: WasmPolicy) -> int:
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


def _check_member(member: tarfile.TarInfo, seen: int, total: int, policy: WasmPolicy) -> str | None:
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


def _scan_headers(archive: Path, policy: WasmPolicy) -> None:
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


def unpack_package(archive: Path, dest: Path, policy: WasmPolicy) -> dict[str, str]:
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


def install(home: Home, data: bytes, source: str = "local", policy: WasmPolicy | None = None) -> InstalledTool:
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
                 policy: WasmPolicy | None = None) -> InstalledTool:
    """Install the package at `archive` under tools/<id>/<version>/ (replacing that version) and record it
    enabled. Unpacks under the limits of unpack_package into a staging directory; nothing is left behind on error."""
    policy = policy or WasmPolicy()
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
            wasmtime.Module.validate(get_engine(), wasm_path.read_bytes())
        except wasmtime.WasmtimeError as exc:
            raise ToolError(f"`{manifest.wasm_file}` is not a valid wasm module: {first_line(exc)}") from exc
        with tools_locked(root):
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
            save_state(home, state)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return get_tool(home, manifest.id)


