"""Content-addressed plugin bundles: one plugin version as a hash, a gzip tarball and a read-only cache directory.

The hash is built from the per-file sha256 the lockfile already records (engine/plugins/install.py, file_hashes), so two
hosts that hold the same files agree on it whatever the order, mtimes or owners of those files. A worker host keeps
unpacked bundles under `$LIBREFANG_HOME/bundles/<hash>/<plugin>/` (a plugin's directory carries its name); each one is checked against its hash before it is used and
never changes afterwards, so a reload (a new hash) can never mix old and new files.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import uuid
from pathlib import Path

from engine.filecache import tree_size
from engine.plugins.manifest import NAME_RE
from engine.plugins.sources import InstallError, check_size, file_hashes

HASH_LEN = 64


class BundleError(Exception):
    pass


def digest(files: dict[str, str]) -> str:
    """One sha256 over the sorted (path, file sha256) pairs."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode())
        h.update(b"\0")
        h.update(files[rel].encode())
        h.update(b"\n")
    return h.hexdigest()


def pack(root: Path) -> tuple[str, bytes]:
    """(hash, gzip tarball) of the plugin directory's regular files, paths relative to the directory."""
    files = file_hashes(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(files):
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(root / rel, "rb") as fh:
                tar.addfile(info, fh)
    return digest(files), buf.getvalue()


def cached_dir(cache_root: Path, bundle_hash: str, name: str) -> Path:
    """Where the plugin directory of a bundle lives once unpacked."""
    if len(bundle_hash) != HASH_LEN or any(c not in "0123456789abcdef" for c in bundle_hash):
        raise BundleError(f"not a bundle hash: {bundle_hash!r}")
    if not NAME_RE.match(name or ""):
        raise BundleError(f"not a plugin name: {name!r}")
    return cache_root / bundle_hash / name


def materialise(cache_root: Path, bundle_hash: str, name: str, blob: bytes) -> Path:
    """Unpack `blob` into `cache_root/<hash>/<name>/`, verified and read-only. Safe when several processes race."""
    target = cached_dir(cache_root, bundle_hash, name)
    if target.is_dir():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = cache_root / f".unpack-{bundle_hash[:12]}-{uuid.uuid4().hex[:8]}"
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            _check_caps(tar, bundle_hash)
            tar.extractall(tmp / name, filter="data")  # no absolute paths, no links out, no devices
        got = digest(file_hashes(tmp / name))
        if got != bundle_hash:
            raise BundleError(f"bundle {bundle_hash[:12]} unpacked to {got[:12]}: refusing to run it")
        _make_read_only(tmp)
        try:
            os.rename(tmp, target.parent)
        except OSError:
            if not target.is_dir():  # anything but "another process got there first"
                raise
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"bundle {bundle_hash[:12]} cannot be unpacked: {exc}") from exc
    finally:
        if tmp.exists():
            _remove(tmp)
    return target


def _check_caps(tar: tarfile.TarFile, bundle_hash: str) -> None:
    """A bundle unpacks to no more than a plugin may bring (engine/plugins/sources.py caps), checked on the
    archive's headers before anything is written."""
    count = total = 0
    for member in tar.getmembers():
        if member.isfile():
            count += 1
            total += member.size
            try:
                check_size(count, total, member.size, member.name)
            except InstallError as exc:
                raise BundleError(f"bundle {bundle_hash[:12]}: {exc.message}") from exc


def cache_usage(cache_root: Path) -> dict:
    """How many bundles the cache holds and their size on disk (shown in the worker heartbeat)."""
    count = size = 0
    if cache_root.is_dir():
        for entry in cache_root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            count += 1
            size += tree_size(entry)
    return {"bundles": count, "bytes": size}


def _make_read_only(root: Path) -> None:
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for dirpath, dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            os.chmod(path, os.lstat(path).st_mode & ~write & 0o7777)
        for name in dirs:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o555)
    os.chmod(root, 0o555)


def _remove(root: Path) -> None:
    for dirpath, _dirs, _names in os.walk(root):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(root, ignore_errors=True)
