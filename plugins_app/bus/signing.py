"""Every job and control entry is signed (HMAC-SHA256): a worker runs nothing it cannot verify. Every reply is signed
too (`seal_reply`), over its job id: the web tier hands an agent nothing it cannot verify (`open_reply`).

The key is `$LIBREFANG_HOME/bus_key` (or LIBREFANG_BUS_KEY_FILE), shared by every web process and worker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import uuid
from pathlib import Path

from django.conf import settings

_key_cache: dict[str, bytes] = {}
_key_lock = threading.Lock()


def bus_key_path() -> Path:
    configured = getattr(settings, "LIBREFANG_BUS_KEY_FILE", None) or os.environ.get("LIBREFANG_BUS_KEY_FILE")
    return Path(configured) if configured else Path(settings.LIBREFANG_HOME) / "bus_key"


def bus_key() -> bytes:
    """The shared signing key; whichever process comes first creates it (0600), atomically, so all agree."""
    path = bus_key_path()
    cached = _key_cache.get(str(path))
    if cached:
        return cached
    with _key_lock:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if not text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # fails if another process won the race: then use its key
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
            text = path.read_text().strip()
        _key_cache[str(path)] = text.encode()
        return _key_cache[str(path)]


def canonical(fields: dict[str, str]) -> bytes:
    return json.dumps(sorted((k, v) for k, v in fields.items() if k != "sig"), separators=(",", ":")).encode()


def sign(fields: dict[str, str]) -> str:
    return hmac.new(bus_key(), canonical(fields), hashlib.sha256).hexdigest()


def signature_ok(fields: dict[str, str]) -> bool:
    given = fields.get("sig") or ""
    return bool(given) and hmac.compare_digest(given, sign(fields))


def _reply_mac(job_id: str, data: str) -> str:
    # "reply" first: a reply's signature can never pass for a job's (those sign a JSON list) nor the reverse
    return hmac.new(bus_key(), b"reply\n" + job_id.encode() + b"\n" + data.encode(), hashlib.sha256).hexdigest()


def seal_reply(job_id: str, data: str) -> str:
    """The reply as it travels: its signature, a newline, its text (a job's: plugins_app/bus/job.py Reply.wire)."""
    return _reply_mac(job_id, data) + "\n" + data


def open_reply(job_id: str, sealed: str) -> str | None:
    """The text of a sealed reply to `job_id`; None when it is unsigned, tampered with or meant for another job."""
    mac, sep, data = sealed.partition("\n")
    if not sep or len(mac) != 64:
        return None
    return data if hmac.compare_digest(mac, _reply_mac(job_id, data)) else None
