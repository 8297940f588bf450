"""Plugin versions in the database, so workers on any host run the same code (engine/plugins/bundles.py).

Web tier: scaffold/install/update/reload/edit publish the plugin directory as a bundle and make it the active one;
uninstall retires it. With LIBREFANG_PIN_BUNDLES=1 every hook job names the active bundle of each enabled plugin
and the context-engine configuration (plugins_app/bus/job.py, `bundles` and `engine_config`, both signed).

Worker: a job that names bundles runs exactly those versions, unpacked on first use from the database into
`$LIBREFANG_HOME/bundles/<hash>/<plugin>/` and verified against the hash. A job without them runs from the local plugin
directory, as on a single host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, transaction

from engine.config import parse_service_config
from engine.plugins import bundles as B
from engine.plugins.loader import load_plugin
from engine.plugins.manifest import ManifestError
from plugins_app.models import ActivePlugin, EngineSetting, PluginBundle

log = logging.getLogger("librefang.bundles")

CONFIG_KEY = "context_engine"
# How long the web tier reuses its view of the active bundles before asking the database again. A publish in the
# same process takes effect at once; one in another web process within this time.
PINS_TTL_SECS = 1.0
PINS_LOAD_TIMEOUT_SECS = 3.0


class PinsUnavailable(Exception):
    """No view of the active plugin versions yet and the database does not answer: a job cannot name them."""


def pinning_enabled() -> bool:
    return os.environ.get("LIBREFANG_PIN_BUNDLES", "").strip().lower() in ("1", "true", "yes", "on")


def cache_root() -> Path:
    return Path(settings.LIBREFANG_HOME) / "bundles"


# ---- publishing (web tier) ----

def publish_bundle(name: str) -> str | None:
    """Store the plugin directory as a bundle and make it the active version. None when it has no valid manifest
    (the previous active version keeps serving)."""
    pdir = Path(settings.LIBREFANG_HOME) / "plugins" / name
    try:
        loaded = load_plugin(pdir)
    except (ManifestError, OSError):
        return None
    digest, archive = B.pack(pdir)
    manifest = loaded.manifest.model_dump(mode="json")
    enabled = not (pdir / ".disabled").exists()
    with transaction.atomic():
        PluginBundle.objects.get_or_create(hash=digest, defaults={"plugin": name, "archive": archive,
                                                                  "manifest": manifest, "size": len(archive)})
        ActivePlugin.objects.update_or_create(name=name, defaults={"bundle_hash": digest, "enabled": enabled,
                                                                   "retired": False})
    _forget_pins()
    return digest


def active_version(name: str) -> dict | None:
    """What the plugin page shows: the active bundle hash, and whether jobs pin it (workers on many hosts)."""
    row = ActivePlugin.objects.filter(name=name, retired=False).first()
    if row is None:
        return None
    return {"hash": row.bundle_hash, "short": row.bundle_hash[:12], "pinned": pinning_enabled()}


def set_bundle_enabled(name: str, enabled: bool) -> None:
    ActivePlugin.objects.filter(name=name).update(enabled=enabled)
    _forget_pins()


def retire_bundle(name: str) -> None:
    ActivePlugin.objects.filter(name=name).update(retired=True, enabled=False)
    _forget_pins()


def sync_config_file() -> None:
    """Copy config.toml into the database when it changed and still parses (a broken file keeps the last copy)."""
    path = Path(settings.LIBREFANG_HOME) / "config.toml"
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        return
    if _config_stamp.get("stamp") == stamp:
        return
    try:
        text = path.read_text(encoding="utf-8")
        parse_service_config(text)
    except Exception:  # a broken or half-written file: keep the copy in the database
        return
    EngineSetting.objects.update_or_create(key=CONFIG_KEY, defaults={"text": text})
    _config_stamp["stamp"] = stamp


_config_stamp: dict[str, tuple] = {}


def publish_config() -> None:
    """config.toml was just written by this process: copy it now, and let the next job carry it."""
    sync_config_file()
    _forget_pins()


# ---- what a job pins (web tier) ----

Pins = tuple[dict[str, str], str]
# The ORM refuses to run on an event loop's thread; the web tier enqueues from one, so the refresh runs here.
_db_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bundle-pins")


class PinsCache:
    """The web process's view of the active plugin versions, refreshed in the database thread: one refresh at a
    time, shared by every caller that needs it; one that finishes after its callers gave up still updates the view.
    forget() (a publish in this process) makes the next caller wait for a refresh started after it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.value: Pins | None = None
        self.at = 0.0
        self.generation = 0  # one more per forget(): a refresh started before it does not make the view fresh
        self.loading: tuple[int, concurrent.futures.Future] | None = None

    def fresh(self) -> Pins | None:
        with self.lock:
            return self.value if self.value is not None and time.monotonic() - self.at < PINS_TTL_SECS else None

    def forget(self) -> None:
        with self.lock:
            self.at = 0.0
            self.generation += 1

    def refresh(self) -> concurrent.futures.Future:
        """The refresh under way since the last forget(), or a new one."""
        with self.lock:
            if self.loading is not None and self.loading[0] == self.generation and not self.loading[1].done():
                return self.loading[1]
            self.loading = (self.generation, _db_thread.submit(self._load, self.generation))
            return self.loading[1]

    def _load(self, generation: int) -> Pins:
        value = _load_pins()
        with self.lock:
            self.value = value
            if generation == self.generation:
                self.at = time.monotonic()
        return value

    def last_known(self, exc: BaseException) -> Pins:
        """The versions last read, when a refresh failed or is late: jobs keep naming them (PinsUnavailable when
        there are none yet)."""
        with self.lock:
            stale = self.value
        if stale is None:
            raise PinsUnavailable(f"cannot read the active plugin versions: {type(exc).__name__}: {exc}") from exc
        log.warning("active plugin versions not refreshed (%s: %s); jobs name the last known ones",
                    type(exc).__name__, exc)
        return stale


_pins = PinsCache()


def _forget_pins() -> None:
    _pins.forget()


def job_pins() -> Pins | None:
    """({plugin: bundle hash} of the enabled active plugins, config text) for a job, or None when pinning is off.
    Waits (up to PINS_LOAD_TIMEOUT_SECS) for the database: for threads; on an event loop, await job_pins_async."""
    if not pinning_enabled():
        return None
    fresh = _pins.fresh()
    if fresh is not None:
        return fresh
    try:
        return _pins.refresh().result(timeout=PINS_LOAD_TIMEOUT_SECS)
    except Exception as exc:  # the database is slow or down
        return _pins.last_known(exc)


async def job_pins_async() -> Pins | None:
    """job_pins for a caller on an event loop: it waits for the database thread without blocking the loop, which
    keeps serving every other call meanwhile."""
    if not pinning_enabled():
        return None
    fresh = _pins.fresh()
    if fresh is not None:
        return fresh
    refresh = asyncio.wrap_future(_pins.refresh())
    # never cancelled (the refresh is shared with other callers); its outcome is read here or left to the view
    refresh.add_done_callback(lambda f: f.cancelled() or f.exception())
    done, _ = await asyncio.wait([refresh], timeout=PINS_LOAD_TIMEOUT_SECS)
    if not done:
        return _pins.last_known(TimeoutError(f"no answer within {PINS_LOAD_TIMEOUT_SECS} s"))
    try:
        return refresh.result()
    except Exception as exc:
        return _pins.last_known(exc)


def _load_pins() -> tuple[dict[str, str], str]:
    close_old_connections()
    sync_config_file()
    if not _backfilled:
        publish_unpublished()
        _backfilled.append(True)
    active = dict(ActivePlugin.objects.filter(enabled=True, retired=False).values_list("name", "bundle_hash"))
    row = EngineSetting.objects.filter(key=CONFIG_KEY).first()
    return active, row.text if row else ""


_backfilled: list[bool] = []


def publish_unpublished() -> list[str]:
    """Publish the plugins of this host's plugin directory that the database has never seen (installed before
    bundles existed, or copied in by hand); run once per web process, before its first pinned job."""
    root = Path(settings.LIBREFANG_HOME) / "plugins"
    if not root.is_dir():
        return []
    known = set(ActivePlugin.objects.values_list("name", flat=True))
    done = []
    for pdir in sorted(root.iterdir()):
        if pdir.is_dir() and pdir.name not in known and (pdir / "plugin.toml").is_file():
            if publish_bundle(pdir.name):
                done.append(pdir.name)
    if done:
        log.warning("published %d plugin(s) the database did not know: %s", len(done), ", ".join(done))
    return done


# ---- running a pinned job (worker) ----

def materialise(pins: dict[str, str]) -> dict[str, Path]:
    """{plugin: local read-only directory} for the job's bundles, fetching any this host does not hold yet."""
    root = cache_root()
    out: dict[str, Path] = {}
    for name, digest in pins.items():
        target = B.cached_dir(root, digest, name)
        if not target.is_dir():
            row = PluginBundle.objects.filter(hash=digest).only("archive").first()
            if row is None:
                raise B.BundleError(f"bundle {digest[:12]} of {name} is not in the database")
            started = time.monotonic()
            B.materialise(root, digest, name, bytes(row.archive))
            log.info("bundle %s of %s unpacked in %.1f ms", digest[:12], name, (time.monotonic() - started) * 1000)
        out[name] = target
    return out
