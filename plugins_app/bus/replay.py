"""A job runs at most once per job id, and a replayed one (the same signed fields XADDed again) never runs.

The first worker to read a job claims its id: `SET <prefix>:engine:seen:<job id> <stream>|<entry id> NX GET`, for
every job of a read in one pipelined round trip. A later entry with the same id finds the claim held by another
entry: it is a replay, refused (plugins_app/services/jobs.py). A redelivery of the same entry (XCLAIM / XAUTOCLAIM
after its worker died, docs/architecture.md "Reliability model") finds its own claim and runs, and a job moved off a
dead host's stream carries its claim to the copy (plugins_app/bus/affinity.py). A claim lives as long as the job
could still run (until its signed `expires`), but at most SEEN_WINDOW_SECS: a job older than that is checked against
its stored outcome instead, so the claims Redis keeps stay bounded by the window, not by the expiry.
"""

from __future__ import annotations

import time

import redis

from plugins_app.bus.job import Job
from plugins_app.bus.keys import prefixed_key

SEEN_WINDOW_SECS = 15 * 60
CLOCK_MARGIN_SECS = 60  # hosts' clocks disagree a little: a claim outlives its job's expiry by this much


def seen_key(job_id: str) -> str:
    return prefixed_key("engine", "seen", job_id)


def claim_of(stream: str, entry_id: str) -> str:
    return f"{stream}|{entry_id}"


def mark_replays(r: redis.Redis, jobs: list[Job]) -> list[Job]:
    """Claim the id of each signed job; mark `replay` on those whose id another entry holds. Returns `jobs`."""
    signed = [j for j in jobs if j.signed]
    if not signed:
        return jobs
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for job in signed:
        ttl = min(job.expires - now, SEEN_WINDOW_SECS) + CLOCK_MARGIN_SECS
        pipe.set(seen_key(job.id), claim_of(*job.key), nx=True, get=True, px=int(max(ttl, 1.0) * 1000))
    for job, held in zip(signed, pipe.execute(), strict=True):
        job.replay = held is not None and held != claim_of(*job.key)
    return jobs
