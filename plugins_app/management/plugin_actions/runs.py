"""`plugin test-hook`, `benchmark` and `prewarm`: hooks run through a live worker when one is heartbeating (like the
dashboard), otherwise in this process with the same engine code (the CLI is not the web tier); the output says which."""

from __future__ import annotations

import json
import sys

from asgiref.sync import async_to_sync, sync_to_async
from django.core.management.base import CommandError
from pydantic import ValidationError

from engine import hook_requests
from plugins_app import bus
from plugins_app.management.plugin_actions.common import Cli, actor, installed, read_input
from plugins_app.selectors import plugins as plugin_selectors
from plugins_app.selectors.examples import example_request

IN_PROCESS = "in-process (no live worker)"


def test_hook(cmd: Cli, name, hook, input=None, timeout=None, **_) -> None:  # noqa: A002
    installed(name)
    request = read_input(input) if input else example_request(hook)
    try:
        request = hook_requests.accept(hook, request).request  # in LibreFang's format, as over the API
    except ValidationError as exc:
        raise CommandError(f"invalid {hook} request: {exc}", returncode=2) from exc

    result, via = _run_test_hook(name, hook, request, timeout)
    if cmd.as_json:
        cmd.out({**result, "via": via})
    else:
        cmd.stderr.write(f"ran {name}.{hook} {via} in {result.get('elapsed_ms')} ms (trace {result.get('trace_id')})")
        if result.get("stderr"):
            cmd.stderr.write("stderr:\n" + result["stderr"].rstrip())
        if result.get("ok"):
            cmd.stdout.write(json.dumps(result.get("reply"), indent=2))
        else:
            err = result.get("error") or {}
            cmd.stderr.write(f"FAILED: {err.get('kind')}: {err.get('message')}")
    if not result.get("ok"):
        sys.exit(1)


def benchmark(cmd: Cli, name, hook=None, runs=5, **_) -> None:
    from plugins_app.services import benchmark as benchmark_service

    if not 1 <= runs <= benchmark_service.MAX_RUNS:
        raise CommandError(f"--runs must be 1-{benchmark_service.MAX_RUNS}", returncode=2)
    runner, via = _benchmark_runner()
    r = async_to_sync(benchmark_service.benchmark)(name, hook, None, runs, actor(), runner)
    if runner is not None:  # in-process runs: their traces are written before the command exits
        from plugins_app.services.engine import invocation_sink

        invocation_sink().flush()
    lines = [f"{name}: {runs} runs per hook, {via}", f"{'HOOK':<22} {'OK':>3} {'ERR':>4} {'P50 ms':>9} "
                                                      f"{'P95 ms':>9} {'MAX ms':>9}"]
    for h in r["hooks"]:
        lat = h["latency_ms"]
        lines.append(f"{h['hook']:<22} {h['ok']:>3} {h['errors']:>4} {_ms(lat['p50'])} {_ms(lat['p95'])} "
                     f"{_ms(lat['max'])}")
    cmd.out({**r, "via": via}, "\n".join(lines))
    if any(h["errors"] for h in r["hooks"]):
        sys.exit(1)


def prewarm(cmd: Cli, name=None, wait=None, **_) -> None:
    from plugins_app.services import prewarm as prewarm_service

    r = async_to_sync(prewarm_service.prewarm)(name, actor(), wait)
    cmd.out(r, "\n".join(prewarm_lines(r)))
    if not r["warmed_everywhere"]:
        sys.exit(1)


def prewarm_lines(r: dict) -> list[str]:
    """One line per worker and plugin: what the worker confirmed, and the workers that did not answer."""
    lines = [f"prewarm {', '.join(r['plugins']) or '(no enabled plugin)'}: {len(r['workers'])} worker(s) answered, "
             f"{len(r['missing'])} did not"]
    if not r["workers"] and not r["missing"]:
        lines.append("  no live worker: nothing was warmed")
    for w in r["workers"]:
        head = f"  {w['host']} pid {w['pid']} ({w['worker']})"
        if w["error"]:
            lines.append(f"{head}: error: {w['error']}")
            continue
        lines.append(f"{head}: zygotes {w['zygote_pids'] or 'none'}")
        for p in w["plugins"]:
            parts = [f"warmed {', '.join(p['warmed'])}" if p["warmed"] else "nothing warmed"]
            parts += [f"{h}: {why}" for h, why in {**p["skipped"], **p["failed"]}.items()]
            lines.append(f"    {p['plugin']}: " + "; ".join(parts))
    for m in r["missing"]:
        lines.append(f"  {m['host']} pid {m['pid']} ({m['worker']}): no answer, not warmed")
    return lines


def _ms(v) -> str:
    return f"{v:>9.1f}" if v is not None else f"{'-':>9}"


def _live_workers() -> list:
    try:
        return async_to_sync(bus.live_workers)()
    except Exception:  # Redis down: no worker to go through
        return []


def _benchmark_runner():
    """Through a worker when one is alive (as the API does), else each run in this process."""
    from plugins_app.services.engine import get_engine

    workers = _live_workers()
    if workers:
        return None, f"via worker ({len(workers)} alive)"

    def one(name, hook, request, timeout):
        attempt = get_engine().test_hook(name, hook, request)
        return {**attempt.result.to_dict(), "trace_id": attempt.trace_id}
    return sync_to_async(one), IN_PROCESS


def _run_test_hook(name: str, hook: str, request: dict, timeout: float | None) -> tuple[dict, str]:
    from plugins_app.services import hooks as hook_service
    from plugins_app.services.engine import get_engine, invocation_sink

    timeout = timeout or plugin_selectors.hook_timeout_secs(name, hook)
    workers = _live_workers()
    if workers:
        reply = async_to_sync(hook_service.test_hook)(name, hook, request, timeout)
        return reply, f"via worker ({len(workers)} alive)"
    attempt = get_engine().test_hook(name, hook, request)
    try:
        invocation_sink().flush()
    except Exception:
        pass
    return {**attempt.result.to_dict(), "trace_id": attempt.trace_id}, IN_PROCESS
