"""Every dashboard page in real Chromium, light and dark: no Content-Security-Policy violation (the browser's
`securitypolicyviolation` events, collected from the first script on), htmx and the websockets working under the
policy, /api/docs from our own static files, and axe-core (tests/vendor/axe-core) with no violation."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_dashboard_failure import _login
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin, write_config

pytestmark = pytest.mark.browser
AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe-core" / "axe.min.js"
COLLECT_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push({directive: e.violatedDirective, blocked: e.blockedURI, source: e.sourceFile, line: e.lineNumber,
                     sample: e.sample});
});
"""
PAGES = ["/", "/create/", "/install/", "/engine/", "/engine/mcp/", "/metrics/", "/traces/", "/workers/", "/doctor/",
         "/tools/", "/tokens/", "/alerts/"]


def _pages(name: str) -> list[str]:
    return [*PAGES, f"/plugins/{name}/", f"/metrics/?plugin={name}&hook=ingest"]


def _axe(page) -> list[dict]:
    if not page.evaluate("() => !!window.axe"):
        page.evaluate(AXE.read_text())  # through the devtools protocol, as the test's own script: no CSP exception
    result = page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    return [{"id": v["id"], "nodes": len(v["nodes"]), "help": v["help"],
             "cases": sorted({(n["target"][0], (n.get("failureSummary") or "").split("(")[-1][:90])
                              for n in v["nodes"]})[:12]}
            for v in result["violations"]]


@pytest.fixture
def traffic(live):
    name = f"policy-{uuid.uuid4().hex[:6]}"
    make_plugin(live.home / "plugins", name, {"ingest": PY_ECHO_INGEST})
    write_config(live.home, plugin=name)
    for i in range(3):
        assert live.hook("ingest", {"agent_id": "policy", "message": f"m{i}", "peer_id": "u"})[0] == 200
    off = f"policy-off-{uuid.uuid4().hex[:6]}"  # a disabled plugin's badge is on the pages too
    make_plugin(live.home / "plugins", off, {"ingest": PY_ECHO_INGEST})
    assert live.request("POST", f"/api/plugins/{off}/disable")[0] == 200
    yield name
    write_config(live.home)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_it_keeps_every_page_within_its_content_security_policy_and_axe_finds_nothing(
        live, browser, traffic, scheme, screenshot_dir):
    context, page = _login(browser, live.url, live.password, init_script=COLLECT_VIOLATIONS, color_scheme=scheme)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    findings: dict[str, list] = {}
    try:
        for path in _pages(traffic):
            response = page.goto(live.url + path)
            assert "script-src 'self'" in response.headers.get("content-security-policy", ""), path
            page.wait_for_load_state("networkidle")
            csp = page.evaluate("() => window.__csp")
            axe = _axe(page)
            if csp or axe:
                findings[path] = {"csp": csp, "axe": axe}
        # htmx swaps (no eval) and the websockets (connect-src 'self') work under the policy
        page.goto(live.url + f"/plugins/{traffic}/")
        page.wait_for_function("() => +document.body.dataset.wsOpen >= 2", timeout=30_000)
        page.select_option("#test-hook", "ingest")
        page.click("#test-run")
        page.wait_for_selector("#test-result .test-result[data-ok=true]", timeout=60_000)
        page.screenshot(path=str(screenshot_dir / f"policy-plugin-{scheme}.png"), full_page=True)
        page.goto(live.url + "/api/docs")
        # Swagger UI's bundle, from our own static files, has loaded the document and rendered it (or its parser's
        # complaint about it: the document's own validity is tests/e2e/test_api_schemathesis.py's concern)
        page.wait_for_selector(".swagger-ui .opblock, .swagger-ui .errors-wrapper", timeout=30_000)
        assert page.evaluate("() => [...document.scripts].every(s => !s.src || s.src.startsWith(location.origin))")
        if page.evaluate("() => window.__csp"):
            findings["/api/docs"] = {"csp": page.evaluate("() => window.__csp")}
    finally:
        context.close()
    assert not findings, json.dumps(findings, indent=1)[:6000]
    assert not [e for e in errors if "Content Security Policy" in e], errors
