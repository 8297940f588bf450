"""Where a plugin comes from and how it is fetched: a local path, a git URL or a registry (engine/plugins/registry.py),
copied without symlinks and within size limits. InstallError is the refusal of any install step."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ServiceError
from engine.plugins import registry as R
from engine.plugins.manifest import NAME_RE

SKIP_NAMES = {".git", "__pycache__", ".disabled", ".DS_Store"}
MAX_FILES = 5000
MAX_FILE_BYTES = 50 * 1024 * 1024
GIT_TIMEOUT_SECS = 120
_GITHUB_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class InstallError(ServiceError):
    """An install, update or uninstall that was refused (engine/errors.py)."""


@dataclass
class Source:
    """Where a plugin comes from; recorded in the lockfile so update can fetch it again."""

    kind: str  # local | git | registry
    path: str | None = None
    url: str | None = None
    ref: str | None = None
    registry: str | None = None
    name: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def parse(cls, data: dict) -> Source:
        if not isinstance(data, dict):
            raise InstallError("invalid_source", "source must be an object")
        kind = data.get("source") or data.get("kind")
        if kind == "local":
            path = data.get("path")
            if not isinstance(path, str) or not path.strip():
                raise InstallError("invalid_source", "a local install needs `path`")
            return cls("local", path=path)
        if kind == "git":
            url = data.get("url")
            ref = data.get("ref") or data.get("branch")
            if not isinstance(url, str) or not url.strip():
                raise InstallError("invalid_source", "a git install needs `url`")
            check_git_url(url)
            return cls("git", url=url, ref=check_git_ref(ref))
        if kind == "registry":
            name = data.get("name")
            registry = data.get("registry") or data.get("github_repo")
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise InstallError("invalid_name", f"registry install needs a valid plugin `name`, got {name!r}")
            if registry is not None and not isinstance(registry, str):
                raise InstallError("invalid_source", "`registry` must be a string")
            return cls("registry", registry=registry, name=name, ref=check_git_ref(data.get("ref") or data.get("branch")))
        raise InstallError("invalid_source", "`source` must be one of: local, git, registry")


# A branch, tag or commit as git's check-ref-format allows it, minus anything git could read as an option
# (a leading '-') or as a revision expression (`..`, `@{`, `^`, `~`, `:`): only a plain name reaches git.
_SAFE_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]{0,254}$")


def check_git_ref(ref) -> str | None:
    """The ref unchanged when it is a plain branch, tag or commit name; None when absent; InstallError otherwise."""
    if ref is None:
        return None
    if not isinstance(ref, str) or not _SAFE_REF.match(ref) or ".." in ref or "//" in ref \
            or ref.endswith((".", "/", ".lock")):
        raise InstallError("invalid_ref", f"`ref` must be a plain branch, tag or commit name, got {ref!r}")
    return ref


def check_git_url(url: str) -> None:
    if url.startswith("-") or any(c in url for c in "\n\r\x00 "):
        raise InstallError("invalid_source", f"refusing git URL {url!r}")
    ok = (url.startswith(("https://", "http://", "git://", "ssh://", "file://")) or "@" in url
          or url.startswith("/"))
    if not ok:
        raise InstallError("invalid_source", f"git URL {url!r} must be https, http, git, ssh, file or an absolute path")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(65536), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """Relative path -> sha256 for every regular file under root (symlinks, .git, caches, .disabled skipped)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES and not os.path.islink(os.path.join(dirpath, d)))
        for fname in sorted(filenames):
            if fname in SKIP_NAMES:
                continue
            full = Path(dirpath) / fname
            if full.is_symlink() or not full.is_file():
                continue
            out[full.relative_to(root).as_posix()] = sha256_file(full)
    return out


def copy_tree(src: Path, dst: Path) -> list[str]:
    """Copy regular files and directories only; symlinks are skipped (returned), never followed."""
    skipped: list[str] = []
    count = 0
    dst.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        keep = []
        for d in sorted(dirnames):
            if d in SKIP_NAMES:
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                skipped.append((rel_dir / d).as_posix())
                continue
            keep.append(d)
            (dst / rel_dir / d).mkdir(parents=True, exist_ok=True)
        dirnames[:] = keep
        for fname in sorted(filenames):
            if fname in SKIP_NAMES:
                continue
            s = Path(dirpath) / fname
            if s.is_symlink():
                skipped.append((rel_dir / fname).as_posix())
                continue
            if not s.is_file():
                continue
            count += 1
            if count > MAX_FILES:
                raise InstallError("too_large", f"the plugin has more than {MAX_FILES} files")
            if s.stat().st_size > MAX_FILE_BYTES:
                raise InstallError("too_large", f"{(rel_dir / fname).as_posix()} is larger than {MAX_FILE_BYTES} bytes")
            shutil.copy2(s, dst / rel_dir / fname, follow_symlinks=False)
    return skipped


def _git(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true",
           "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=accept-new"}
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_SECS,
                              env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise InstallError("git_missing", "git is not installed (apt install git)") from exc
    except subprocess.TimeoutExpired as exc:
        raise InstallError("git_failed", f"git {args[0]} took longer than {GIT_TIMEOUT_SECS}s") from exc


def git_fetch(url: str, ref: str | None, into: Path) -> str:
    """Clone url (at ref) into `into`; returns the commit sha. Whatever the caller checked, url and ref are checked
    again here, and every git call that carries them ends option parsing first (--end-of-options, git >= 2.24)."""
    check_git_url(url)
    ref = check_git_ref(ref)
    args = ["clone", "--quiet", "--depth=1"]
    if ref:
        args += [f"--branch={ref}"]
    out = _git([*args, "--end-of-options", url, str(into)])
    if out.returncode != 0 and ref:
        # ref may be a commit: full clone, then check it out
        shutil.rmtree(into, ignore_errors=True)
        out = _git(["clone", "--quiet", "--end-of-options", url, str(into)])
        if out.returncode == 0:
            # `git checkout` ignores --end-of-options (2.39); `switch --detach` honours it
            out = _git(["switch", "--quiet", "--detach", "--end-of-options", ref], cwd=into)
    if out.returncode != 0:
        raise InstallError("git_failed", f"git could not fetch {url}{' at ' + ref if ref else ''}: "
                                         f"{out.stderr.strip()[-500:]}")
    rev = _git(["rev-parse", "HEAD"], cwd=into)
    return rev.stdout.strip()


def registry_location(registry: str | None, default: str | None) -> str:
    reg = registry or default
    if not reg:
        raise InstallError("no_registry", "no registry given and none configured ([plugins] registry in config.toml)")
    if _GITHUB_REPO.match(reg) and not Path(reg).exists():
        return f"https://github.com/{reg}.git"
    return reg


@contextlib.contextmanager
def registry_root(location: str, ref: str | None = None) -> Iterator[tuple[Path, dict]]:
    """(the registry's root directory, provenance): a local directory as is, a git registry cloned to a temp dir."""
    local = Path(location).expanduser()
    if local.is_absolute() and local.is_dir():
        yield local.resolve(), {"registry_path": str(local.resolve())}
        return
    with tempfile.TemporaryDirectory(prefix="lf-registry-") as tmp:
        rev = git_fetch(location, ref, Path(tmp) / "registry")
        yield Path(tmp) / "registry", {"registry_url": location, "commit": rev}


def registry_error(exc: R.RegistryError) -> InstallError:
    return InstallError(exc.code, exc.message, exc.status)


def registry_listing(root: Path, cfg: R.RegistryConfig) -> R.Listing:
    try:
        return R.read_listing(root, cfg)
    except R.RegistryError as exc:
        raise registry_error(exc) from exc


@contextlib.contextmanager
def fetched(source: Source, default_registry: str | None = None,
            registries: Sequence[R.RegistryConfig] = ()) -> Iterator[tuple[Path, dict]]:
    """Yields (directory holding the plugin, provenance) for a source; temp files are removed afterwards.
    A registry with a configured public key must vouch for the plugin in its signed index (engine/plugins/registry.py)."""
    with tempfile.TemporaryDirectory(prefix="lf-install-") as tmp:
        tmpdir = Path(tmp)
        if source.kind == "local":
            path = Path(source.path or "").expanduser()
            if not path.is_absolute():
                raise InstallError("invalid_source", "a local path must be absolute")
            path = path.resolve()
            if not (path / "plugin.toml").is_file():
                raise InstallError("not_a_plugin", f"{path} has no plugin.toml")
            yield path, {"path": str(path)}
        elif source.kind == "git":
            rev = git_fetch(source.url or "", source.ref, tmpdir / "repo")
            root = tmpdir / "repo"
            if not (root / "plugin.toml").is_file():
                raise InstallError("not_a_plugin", f"{source.url} has no plugin.toml at its root")
            yield root, {"commit": rev}
        elif source.kind == "registry":
            loc = registry_location(source.registry, default_registry)
            cfg = R.config_for(source.registry or default_registry or "", list(registries))
            with registry_root(loc, source.ref) as (root, prov):
                pdir = root / "plugins" / (source.name or "")
                if pdir.is_symlink() or not (pdir / "plugin.toml").is_file():
                    raise InstallError("not_found", f"registry {loc} has no plugins/{source.name}/plugin.toml", 404)
                if cfg.public_key or cfg.signatures_required:
                    listing = registry_listing(root, cfg)
                    try:
                        R.check_membership(listing, source.name or "", pdir, cfg)
                    except R.RegistryError as exc:
                        raise registry_error(exc) from exc
                    prov = {**prov, "index_signed": listing.signed}
                yield pdir, prov
        else:  # pragma: no cover - Source.parse forbids it
            raise InstallError("invalid_source", f"unknown source kind {source.kind!r}")
