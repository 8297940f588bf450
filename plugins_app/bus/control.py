"""The control stream, read by every worker (not a consumer group: each reads all of it), carries prewarm requests
from the web tier (prewarm); workers answer on a short-lived list per request, each answer signed for that request:
the web tier counts no answer it cannot verify."""

from __future__ import annotations

import json
import logging
import time
import uuid

import redis

from plugins_app.bus.clients import REDIS_DOWN, BusUnavailable, aclient
from plugins_app.bus.keys import REPLY_TTL_SECS, control_key, prewarm_answers_key
from plugins_app.bus.signing import open_reply, seal_reply, sign, signature_ok
from plugins_app.bus.status import live_workers

log = logging.getLogger("librefang.bus")

CONTROL_MAXLEN = 100


# ---- worker side (JobStream.control_cursor, read_control, answer_prewarm) ----

def cursor_now(r: redis.Redis) -> str:
    """Where a worker starts reading the control stream: requests made from now on."""
    try:
        last = r.xrevrange(control_key(), "+", "-", count=1)
    except redis.ResponseError:
        last = []
    return last[0][0] if last else "0-0"


def read_after(r: redis.Redis, cursor: str, block_ms: int) -> tuple[str, list[dict[str, str]]]:
    """Control entries after `cursor` whose signature verifies; (new cursor, entries)."""
    resp = r.xread({control_key(): cursor}, count=10, block=block_ms)
    out = []
    for _name, entries in resp or []:
        for entry_id, fields in entries:
            cursor = entry_id
            if signature_ok(fields):
                out.append(fields)
            else:
                log.error("control entry %s ignored: signature missing or invalid", entry_id)
    return cursor, out


def answer_prewarm(r: redis.Redis, worker: str, stamp: str, answer: dict) -> None:
    key = prewarm_answers_key(stamp)
    pipe = r.pipeline()
    pipe.rpush(key, seal_reply(answer_id(stamp), json.dumps({"worker": worker, **answer})))
    pipe.expire(key, REPLY_TTL_SECS)
    pipe.execute()


def answer_id(stamp: str) -> str:
    """What a worker's signed answer to one prewarm request is bound to (plugins_app/bus/signing.py seal_reply)."""
    return f"prewarm:{stamp}"


# ---- web tier ----

async def prewarm(plugins: list[str], wait_secs: float, pins: tuple[dict[str, str], str] | None = None) -> dict:
    """Ask every live worker to warm `plugins` (and fetch their pinned bundles); wait up to `wait_secs` for each
    worker that heartbeats now to answer. Returns {"stamp", "answers": [...], "missing": [worker, ...]}."""
    r = aclient()
    stamp = uuid.uuid4().hex
    fields = {"kind": "prewarm", "stamp": stamp, "plugins": json.dumps(plugins), "at": repr(time.time())}
    if pins is not None:
        fields["bundles"] = json.dumps(pins[0], sort_keys=True)
        fields["engine_config"] = pins[1]
    fields["sig"] = sign(fields)
    try:
        expected = {w["worker"]: w for w in await live_workers() if w.get("worker")}
        await r.xadd(control_key(), fields, maxlen=CONTROL_MAXLEN, approximate=True)
    except REDIS_DOWN as exc:
        raise BusUnavailable(f"Redis unreachable ({type(exc).__name__}: {exc})") from exc
    answers: dict[str, dict] = {}
    end = time.monotonic() + wait_secs
    while set(expected) - set(answers):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            got = await r.blpop([prewarm_answers_key(stamp)], timeout=max(0.01, min(left, 1.0)))
        except REDIS_DOWN:
            break
        data = open_reply(answer_id(stamp), got[1]) if got else None
        if got and data is None:
            log.error("dropped an answer to prewarm %s: its signature is missing or does not match", stamp)
        elif data is not None:
            answer = json.loads(data)
            answers[answer.get("worker", "")] = answer
    missing = [{"worker": w, "host": info.get("host", ""), "pid": info.get("pid")}
               for w, info in sorted(expected.items()) if w not in answers]
    return {"stamp": stamp, "answers": [answers[w] for w in sorted(answers)], "missing": missing}

