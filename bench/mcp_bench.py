"""MCP `recall` next to the REST ingest call, on the same live service and the same python hook (bench_py).

`phase_mcp(service)` interleaves one REST ingest (a keep-alive HTTP connection, as bench/run.py's agents use) and
one MCP `recall` (one open MCP session, the official SDK's client over Streamable HTTP) per round and reports both
with the ratio MCP / REST (goal: p50 ≤ 1.2). bench/run.py can call it with its service; run alone
(`.venv/bin/python bench/mcp_bench.py`) it starts its own service.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.run import REQUEST, Client, n, ratio, rest_once, summary, write_plugins  # noqa: E402
from tests.e2e.live import LiveService, running_service  # noqa: E402
from tests.plugin_factory import write_config  # noqa: E402


async def _phase(service: LiveService, rounds: int, expect_source: str) -> dict:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    client = Client(service)
    args = {"agent_id": REQUEST["agent_id"], "query": REQUEST["message"], "peer_id": REQUEST["peer_id"]}

    async def recall_once(session: ClientSession) -> float:
        started = time.perf_counter()
        result = await session.call_tool("recall", args)
        elapsed = (time.perf_counter() - started) * 1000
        body = result.structured_content or json.loads(result.content[0].text)
        if result.is_error or body.get("source") != expect_source:
            raise RuntimeError(f"MCP recall answered {str(body)[:300]}")
        return elapsed

    rest, mcp = [], []
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {service.token}"}, timeout=120) as http,
                streamable_http_client(service.url + "/mcp", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        for _ in range(10):  # warm-up: connections, the zygote, the token cache
            rest_once(client, expect_source)
            await recall_once(session)
        for _ in range(rounds):
            rest.append(rest_once(client, expect_source))
            mcp.append(await recall_once(session))
    r, m = summary(rest), summary(mcp)
    m.update(ratio_p50=ratio(m, r), ratio_p95=ratio(m, r, "p95_ms"), ratio_p99=ratio(m, r, "p99_ms"))
    return {"rest_ingest": r, "mcp_recall": m}


def phase_mcp(service: LiveService, expect_source: str = "bench_py") -> dict:
    """{"rest_ingest": summary, "mcp_recall": summary + ratio_p50/p95/p99 against REST}."""
    return asyncio.run(_phase(service, n(200), expect_source))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp, running_service(Path(tmp)) as service:
        write_plugins(service.home, with_wasm=False)
        write_config(service.home, plugin="bench_py")
        result = phase_mcp(service)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
