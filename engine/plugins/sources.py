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
from engine.filecache import tree_size
from engine.plugins import registry as R
from engine.plugins.manifest import NAME_RE

SKIP_NAMES = {".git", "__pycache__", ".disabled", ".DS_Store"}
# What one plugin may bring, however it comes (a directory, a git checkout, a registry): the caps hold before
# anything is written (a git tree is measured before it is checked out: a small clone can expand to far more).
MAX_FILES = 5000
MAX_FILE_BYTES = 50 * 1024 * 1024
MAX_TOTAL_BYTES = 200 * 1024 * 1024
MAX_GIT_BYTES = 200 * 1024 * 1024  # the cloned repository itself (.git)
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
    count = total = 0
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
            size = s.stat().st_size
            total += size
            check_size(count, total, size, (rel_dir / fname).as_posix())
            shutil.copy2(s, dst / rel_dir / fname, follow_symlinks=False)
    return skipped


def check_size(count: int, total: int, size: int, rel: str) -> None:
    """InstallError `too_large` once a plugin's files go past a cap (count, one file, all of them)."""
    if count > MAX_FILES:
        raise InstallError("too_large", f"the plugin has more than {MAX_FILES} files")
    if size > MAX_FILE_BYTES:
        raise InstallError("too_large", f"{rel} is larger than {MAX_FILE_BYTES} bytes")
    if total > MAX_TOTAL_BYTES:
        raise InstallError("too_large", f"the plugin's files add up to more than {MAX_TOTAL_BYTES} bytes")


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
    again here, and every git call that carries them ends option parsing first (--end-of-options, git >= 2.24).
    Nothing is checked out before the commit's tree is measured against the caps (`check_tree`)."""
    check_git_url(url)
    ref = check_git_ref(ref)
    args = ["clone", "--quiet", "--no-checkout", "--depth=1"]
    if ref:
        args += [f"--branch={ref}"]
    out = _git([*args, "--end-of-options", url, str(into)])
    target = "HEAD"
    if out.returncode != 0 and ref:
        # ref may be a commit: full clone, then that commit
        shutil.rmtree(into, ignore_errors=True)
        out = _git(["clone", "--quiet", "--no-checkout", "--end-of-options", url, str(into)])
        target = ref
    if out.returncode == 0:
        out = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{target}^{{commit}}"], cwd=into)
    if out.returncode != 0:
        raise InstallError("git_failed", f"git could not fetch {url}{' at ' + ref if ref else ''}: "
                                         f"{out.stderr.strip()[-500:]}")
    rev = out.stdout.strip()
    if tree_size(str(into / ".git")) > MAX_GIT_BYTES:
        raise InstallError("too_large", f"the repository at {url} is larger than {MAX_GIT_BYTES} bytes")
    check_tree(into, rev)
    # `git checkout` ignores --end-of-options (2.39); `switch --detach` honours it. rev is a commit sha.
    out = _git(["switch", "--quiet", "--discard-changes", "--detach", "--end-of-options", rev], cwd=into)
    if out.returncode != 0:
        raise InstallError("git_failed", f"git could not check out {rev[:12]} of {url}: {out.stderr.strip()[-500:]}")
    return rev


def check_tree(repo: Path, rev: str) -> None:
    """The caps (file count, file size, total) applied to a commit's tree as git lists it, before checkout."""
    out = _git(["ls-tree", "-r", "-l", "-z", "--end-of-options", rev], cwd=repo)
    if out.returncode != 0:
        raise InstallError("git_failed", f"git could not list {rev[:12]}: {out.stderr.strip()[-500:]}")
    count = total = 0
    for line in out.stdout.split("\0"):
        meta, _, rel = line.partition("\t")
        fields = meta.split()
        if len(fields) == 4 and fields[1] == "blob" and fields[3].isdigit():
            count += 1
            total += int(fields[3])
            check_size(count, total, int(fields[3]), rel)


def registry_location(registry: str | None, default: str | None,
                      registries: Sequence[R.RegistryConfig] = ()) -> str:
    """Where a registry is: a configured one by its name, else the location given (owner/repo: GitHub)."""
    reg = registry or default
    if not reg:
        raise InstallError("no_registry", "no registry given and none configured ([plugins] registry in config.toml)")
    reg = next((r.location for r in registries if r.name == reg), reg)
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
            loc = registry_location(source.registry, default_registry, registries)
            cfg = R.config_for(source.registry or default_registry or "", list(registries))
            with registry_root(loc, source.ref) as (root, prov):
                pdir = root / "plugins" / (source.name or "")
                if pdir.is_symlink() or not (pdir / "plugin.toml").is_file():
                    raise InstallError("not_found", f"registry {loc} has no plugins/{source.name}/plugin.toml", 404)
                if cfg.public_key or cfg.signatures_required:
                    listing = registry_listing(root, cfg)
                    prov = {**prov, **vouched(listing, source.name or "", pdir, cfg)}
                yield pdir, prov
        else:  # pragma: no cover - Source.parse forbids it
            raise InstallError("invalid_source", f"unknown source kind {source.kind!r}")


SIGNED_FILES = "signed_files"  # provenance key: the files a signed index listed, checked again once staged


def vouched(listing: R.Listing, name: str, pdir: Path, cfg: R.RegistryConfig) -> dict:
    """Provenance of a plugin a signed index must vouch for: checked here (engine/plugins/registry.py
    check_membership), and its listed files kept to check the staged copy against (what is installed is what was
    checked, whatever changes in the registry meanwhile)."""
    try:
        R.check_membership(listing, name, file_hashes(pdir), cfg)
    except R.RegistryError as exc:
        raise registry_error(exc) from exc
    entry = listing.entry(name) if listing.signed else None
    return {"index_signed": listing.signed, **({SIGNED_FILES: dict(entry["files"])} if entry else {})}


def check_staged(listing_files: dict[str, str] | None, name: str, staged: Path) -> None:
    """The staged copy of a plugin from a signed index holds exactly the files the index listed."""
    if listing_files is None:
        return
    listing = R.Listing([{"name": name, "files": listing_files}], True, R.INDEX_FILE)
    try:
        R.check_membership(listing, name, file_hashes(staged), R.RegistryConfig("", "signed index"))
    except R.RegistryError as exc:
        raise registry_error(exc) from exc
