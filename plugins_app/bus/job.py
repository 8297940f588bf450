"""One job: the signed fields that go into a stream entry (job_fields), the Job a worker reads back (parse_job) and the
Reply it answers with."""

from __future__ import annotations

import contextvars
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from plugins_app.bus.clients import BusUnavailable
from plugins_app.bus.keys import reply_channel_prefix, stream_key
from plugins_app.bus.signing import sign, signature_ok


def to_json(data: Any) -> str:
    """The JSON of every answer an agent gets (a worker's Reply, the web tier's own answers, the routes'
    json_response): characters as they are, anything else as text. One encoding, so that a worker's reply goes out
    to the agent as it came."""
    return json.dumps(data, ensure_ascii=False, default=str)


# Reply.status of a job that failed in the worker (an engine error, a refused plugin): its body says why, in text.
FAILED = 500


@dataclass(frozen=True)
class Reply:
    """A worker's answer to a job, as it travels (sealed over the job id, plugins_app/bus/signing.py) and as the
    caller waiting for it gets it: `status`, the HTTP status of the answer (200; 502 for a hook that aborted the
    turn) or FAILED, and `body`, the answer's JSON text (FAILED: why), passed on to an agent as it is."""

    status: int
    body: str

    @classmethod
    def of(cls, data: Any, status: int = 200) -> Reply:
        return cls(status, to_json(data))

    @classmethod
    def failure(cls, why: str) -> Reply:
        return cls(FAILED, why)

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def data(self) -> Any:
        """The body, parsed (callers that read what an answer says rather than pass it on)."""
        return json.loads(self.body)

    def wire(self) -> str:
        """What is sealed and sent: the status, a newline, the body."""
        return f"{self.status}\n{self.body}"

    @classmethod
    def from_wire(cls, text: str) -> Reply | None:
        status, sep, body = text.partition("\n")
        return cls(int(status), body) if sep and status.isdigit() else None


@dataclass
class Job:
    id: str  # our job id (also the reply key suffix)
    entry_id: str  # the stream entry id
    kind: str  # "hook" | "test_hook" | ...
    hook: str
    request: Any
    deadline: float  # unix time; 0 = none (fire-and-forget)
    wants_reply: bool
    plugin: str = ""
    enqueued_at: float = 0.0
    deliveries: int = 1
    reply_to: str = ""  # the web process's reply channel ("" = only the reply list)
    signed: bool = True  # False: the entry's signature did not verify; it must never run
    origin: str = ""  # who queued it when not an agent over REST ("mcp"): its traces say so
    bundles: dict[str, str] | None = None  # plugin -> bundle hash to run (plugins_app/services/bundles.py)
    engine_config: str = ""  # config.toml text that goes with `bundles`
    stream: str = ""  # the stream it was read from ("" = the shared one)
    expires: float = 0.0  # unix time (signed): past it the job never runs, and a replay of it is refused
    replay: bool = False  # another entry with this job id was read first (plugins_app/bus/replay.py)

    @property
    def expired(self) -> bool:
        return time.time() > (self.expires or self.deadline or float("inf"))

    @property
    def key(self) -> tuple[str, str]:
        """Entry ids are unique per stream only."""
        return self.stream or stream_key(), self.entry_id


# Jobs that run plugin code name the exact plugin versions, when the operator turned pinning on (multi-host).
PINNED_KINDS = ("hook", "test_hook")
# How long a job without a deadline (after_turn, on_event, installs) may wait for a worker before it is dropped as
# expired: the bound of the at-least-once promise, and of how long a replay of it must be recognised.
FIRE_AND_FORGET_EXPIRY_SECS = 24 * 3600


# Set by a caller (the /mcp server) around its calls: the jobs it queues carry this origin.
JOB_ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("job_origin", default="")


def job_fields(kind: str, hook: str, request: Any, deadline_secs: float | None, wants_reply: bool,
               plugin: str = "", reply_to: str = "") -> tuple[str, dict[str, str]]:
    """(job id, the signed fields of its stream entry), for a caller in a thread: naming the plugin versions may
    wait for the database. On an event loop: job_fields_async."""
    return _signed(_fields(kind, hook, request, deadline_secs, wants_reply, plugin, reply_to), _pins(kind))


async def job_fields_async(kind: str, hook: str, request: Any, deadline_secs: float | None, wants_reply: bool,
                           plugin: str = "", reply_to: str = "") -> tuple[str, dict[str, str]]:
    """job_fields for a caller on an event loop: the plugin versions are awaited, the loop keeps serving."""
    return _signed(_fields(kind, hook, request, deadline_secs, wants_reply, plugin, reply_to), await _pins_async(kind))


def _fields(kind: str, hook: str, request: Any, deadline_secs: float | None, wants_reply: bool, plugin: str,
            reply_to: str) -> dict[str, str]:
    now = time.time()
    deadline = now + deadline_secs if deadline_secs else 0.0
    fields = {
        "id": uuid.uuid4().hex,
        "kind": kind,
        "hook": hook,
        "plugin": plugin,
        "request": json.dumps(request),
        "deadline": repr(deadline) if deadline else "0",
        "expires": repr(deadline or now + FIRE_AND_FORGET_EXPIRY_SECS),
        "reply": "1" if wants_reply else "0",
        "reply_to": reply_to,
        "enqueued_at": repr(now),
    }
    if JOB_ORIGIN.get():
        fields["origin"] = JOB_ORIGIN.get()
    return fields


def _signed(fields: dict[str, str], pins: tuple[dict[str, str], str] | None) -> tuple[str, dict[str, str]]:
    if pins is not None:
        fields["bundles"] = json.dumps(pins[0], sort_keys=True)
        fields["engine_config"] = pins[1]
    fields["sig"] = sign(fields)
    return fields["id"], fields


def _pins(kind: str):
    if kind not in PINNED_KINDS:
        return None
    from plugins_app.services.bundles import PinsUnavailable, job_pins

    try:
        return job_pins()
    except PinsUnavailable as exc:  # callers treat it like Redis down: the agent gets the default engine
        raise BusUnavailable(str(exc)) from exc


async def _pins_async(kind: str):
    if kind not in PINNED_KINDS:
        return None
    from plugins_app.services.bundles import PinsUnavailable, job_pins_async

    try:
        return await job_pins_async()
    except PinsUnavailable as exc:
        raise BusUnavailable(str(exc)) from exc


def parse_job(entry_id: str, fields: dict[str, str], deliveries: int = 1, stream: str = "") -> Job:
    """The Job of a stream entry; one whose signature or fields do not hold up comes back with signed=False."""
    signed = signature_ok(fields)
    if fields.get("moved"):  # moved off a dead host's stream: it may have run there already (dedup by JobRecord)
        deliveries = max(deliveries, 2)
    try:
        request = json.loads(fields.get("request") or "null")
        deadline = float(fields.get("deadline") or 0)
        enqueued_at = float(fields.get("enqueued_at") or 0)
        expires = float(fields.get("expires") or 0) or deadline or enqueued_at + FIRE_AND_FORGET_EXPIRY_SECS
        bundles = json.loads(fields["bundles"]) if "bundles" in fields else None
        if bundles is not None and not (isinstance(bundles, dict)
                                        and all(isinstance(v, str) for v in bundles.values())):
            raise ValueError("bundles must map plugin names to hashes")
    except ValueError:
        request, deadline, enqueued_at, expires, signed, bundles = None, 0.0, 0.0, 0.0, False, None
    reply_to = fields.get("reply_to", "")
    if reply_to and not reply_to.startswith(reply_channel_prefix()):
        reply_to, signed = "", False
    return Job(
        id=fields.get("id", entry_id), entry_id=entry_id, kind=fields.get("kind", "hook"),
        hook=fields.get("hook", ""), request=request, deadline=deadline, wants_reply=fields.get("reply") == "1",
        plugin=fields.get("plugin", ""), enqueued_at=enqueued_at, deliveries=deliveries, reply_to=reply_to,
        signed=signed, origin=fields.get("origin", "")[:20], bundles=bundles,
        engine_config=fields.get("engine_config", ""), stream=stream, expires=expires,
    )

