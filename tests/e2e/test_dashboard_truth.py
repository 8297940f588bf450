"""The dashboard never says something untrue, and scaffolding writes what the docs promise:
real service, real worker, real hooks, real Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from engine import hooks as H
from engine.plugins.scaffold_templates import SCAFFOLD_HOOKS
from engine.process.runtimes import RUNTIMES, find_launcher
from plugins_app.selectors.examples import example_request
from tests.waiting import wait_until

SCAFFOLD_RUNTIMES = ["python", "node", "ruby", "php", "bash", "lua", "native", "deno", "bun", "go", "v", "wasm"]


def _installed(tag: str) -> bool:
    return RUNTIMES[tag].launcher is None or find_launcher(tag) is not None


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class ActiveEngine:
    """Sets the live service's context engine for one test and puts the default engine back afterwards."""

    def __init__(self, live, plugin: str | None = None, stack: list[str] | None = None):
        self.live, self.body = live, {"plugin": plugin, "plugin_stack": stack}

    def __enter__(self):
        status, body = self.live.request("PUT", "/api/context-engine/config", self.body)
        assert status == 200, body
        return self

    def __exit__(self, *exc):
        self.live.request("PUT", "/api/context-engine/config", {"plugin": None, "plugin_stack": None})


def _scaffold(live, name: str, runtime: str = "python", hooks: list[str] | None = None) -> None:
    body = {"name": name, "runtime": runtime, "description": "e2e"}
    if hooks is not None:
        body["hooks"] = hooks
    status, reply = live.request("POST", "/api/plugins/scaffold", body)
    assert status == 201, reply


def _traces(live, **filters) -> list[dict]:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    status, body = live.request("GET", f"/api/context-engine/traces?{query}")
    assert status == 200, body
    return body["traces"] if isinstance(body, dict) else body


def _wait_for_trace(live, timeout: float = 20, **filters) -> dict:
    return wait_until(lambda: _traces(live, **filters), timeout, f"a trace for {filters}")[0]


# ---- 1. scaffolded templates pass real agent calls, and the test console agrees -------------------------------

@pytest.mark.parametrize("runtime", SCAFFOLD_RUNTIMES)
def test_it_scaffolds_seven_hooks_that_agents_really_use(live, runtime):
    if not _installed(runtime):
        pytest.skip(f"{runtime} is not installed here")
    name = _unique(f"scaf-{runtime}")
    _scaffold(live, name, runtime, list(SCAFFOLD_HOOKS))
    with ActiveEngine(live, plugin=name):
        for hook in SCAFFOLD_HOOKS:
            request = example_request(hook)
            status, reply = live.hook(hook, request)
            if hook in H.FIRE_AND_FORGET_HOOKS:
                assert status == 202, reply
                trace = _wait_for_trace(live, plugin=name, hook=hook)
                assert trace["success"], trace
            else:
                assert status == 200, reply
                assert reply["source"] == name and "fallback_reason" not in reply, (hook, reply)
                if hook in (H.ASSEMBLE, H.COMPACT):
                    assert reply["messages"] == request["messages"]
            # the test console's verdict for the same request is the agent call's verdict
            status, console = live.request("POST", f"/api/plugins/{name}/test-hook", {"hook": hook, "input": request})
            assert status == 200 and console["ok"] and not console.get("error"), (hook, console)


def test_it_gives_the_test_console_the_same_verdict_and_reason_as_an_agent_call(live):
    name = _unique("empty-asm")
    _scaffold(live, name, "python", [H.ASSEMBLE])
    (live.home / "plugins" / name / "hooks" / "assemble.py").write_text(
        'import json\nprint(json.dumps({"type": "assemble_result", "messages": []}))\n')
    request = example_request(H.ASSEMBLE)
    with ActiveEngine(live, plugin=name):
        status, agent = live.hook(H.ASSEMBLE, request)
    assert status == 200 and agent["source"] == "default"
    status, console = live.request("POST", f"/api/plugins/{name}/test-hook", {"hook": H.ASSEMBLE, "input": request})
    assert status == 200 and console["ok"] is False
    error = console["error"]
    assert error["kind"] == "invalid_output"
    assert agent["fallback_reason"] == f"{name}: {error['kind']}: {error['message']}"


# ---- 3. one last-good configuration for the web tier and the worker --------------------------------------------

SLOW_ASSEMBLE = "import time\ntime.sleep(30)\n"


def test_it_serves_the_same_last_good_configuration_in_web_and_worker_after_a_failed_reload(live):
    name = _unique("lastgood")
    _scaffold(live, name, "python", [H.ASSEMBLE])
    pdir = live.home / "plugins" / name
    manifest = pdir / "plugin.toml"
    original = manifest.read_text()
    with ActiveEngine(live, plugin=name):
        # both processes load the first version (hook_timeout_secs = 30 by default) through a real call
        status, reply = live.hook(H.ASSEMBLE, example_request(H.ASSEMBLE))
        assert status == 200 and reply["source"] == name, reply
        (pdir / "hooks" / "assemble.py").write_text(SLOW_ASSEMBLE)
        manifest.write_text(original.replace("[hooks]\n", "[hooks]\nhook_timeout_secs = 3\n"))
        status, body = live.request("POST", f"/api/plugins/{name}/reload")
        assert status == 200 and body["hook_timeout_secs"] == 3, body
        manifest.write_text(original.replace("[hooks]\n", "[hooks]\nhook_timeout_secs = \n"))  # broken TOML
        status, body = live.request("POST", f"/api/plugins/{name}/reload")
        assert status == 400, body
        started = time.monotonic()
        status, reply = live.hook(H.ASSEMBLE, example_request(H.ASSEMBLE))
        elapsed = time.monotonic() - started
    assert status == 200 and reply["source"] == "default"
    # the worker ran the hook with the same 3 s the web tier waited for, so ITS classified failure came back
    assert reply["fallback_reason"].startswith(f"{name}: timeout"), reply
    assert 2.5 < elapsed < 10, elapsed
    trace = _wait_for_trace(live, plugin=name, hook=H.ASSEMBLE, failures_only="true")
    assert trace["success"] is False and trace["error_kind"] == "timeout", trace


# ---- 5. disabling the plugin that serves agents -----------------------------------------------------------------

def test_it_confirms_disabling_the_serving_plugin_and_says_why_agents_fall_back(live, logged_in_page):
    name = _unique("serving")
    _scaffold(live, name, "python", [H.ASSEMBLE])
    page = logged_in_page
    with ActiveEngine(live, plugin=name):
        page.goto(f"{live.url}/plugins/{name}/")
        assert "serving agents" in page.inner_text("#plugin-state")
        dialogs = []

        def accept(dialog):
            dialogs.append(dialog.message)
            dialog.accept()
        page.on("dialog", accept)
        page.click("#toggle-form button")
        page.wait_for_selector("#action-feedback [data-ok=true]")
        assert dialogs and f"Disable {name}?" in dialogs[0] and "default engine" in dialogs[0]
        assert f"plugin_disabled: {name} is disabled" in dialogs[0]
        status, reply = live.hook(H.ASSEMBLE, example_request(H.ASSEMBLE))
    assert status == 200 and reply["source"] == "default"
    assert reply["fallback_reason"] == f"plugin_disabled: {name} is disabled"


# ---- 2. enabled is not "able to run" ---------------------------------------------------------------------------

def _write_plugin(live, name: str, runtime: str, ext: str) -> None:
    pdir = live.home / "plugins" / name
    (pdir / "hooks").mkdir(parents=True)
    (pdir / "hooks" / f"ingest.{ext}").write_text('print("{}")\n')
    (pdir / "plugin.toml").write_text(f'name = "{name}"\nversion = "0.1.0"\ndescription = "d"\nauthor = "a"\n'
                                      f'[hooks]\nruntime = "{runtime}"\ningest = "hooks/ingest.{ext}"\n')


def test_it_says_enabled_but_cannot_run_and_makes_an_unknown_runtime_an_error(live, logged_in_page):
    missing = next((t for t in ("deno", "bun", "go", "v") if not _installed(t)), None)
    if missing is None:
        pytest.skip("every runtime is installed here")
    blocked, cobol = _unique("blocked"), _unique("cobol")
    _write_plugin(live, blocked, missing, RUNTIMES[missing].extension)
    _write_plugin(live, cobol, "cobol", "cob")
    status, lint = live.request("GET", f"/api/plugins/{cobol}/lint")
    assert [e["id"] for e in lint["errors"]] == ["manifest.runtime_unknown"], lint
    status, lint = live.request("GET", f"/api/plugins/{blocked}/lint")
    assert "runtime.unavailable" in [e["id"] for e in lint["errors"]], lint
    page = logged_in_page
    with ActiveEngine(live, stack=[blocked, cobol]):
        page.goto(f"{live.url}/?q={blocked}")
        state = page.inner_text(f"#plugin-row-{blocked} td[data-label=State]")
        assert f"enabled, cannot run ({RUNTIMES[missing].launcher} not installed)" in state
        assert "serving" not in state
        assert f"{blocked} cannot run" in page.inner_text("#engine-summary")
        page.goto(f"{live.url}/?q={cobol}")
        assert "invalid" in page.inner_text(f"#plugin-row-{cobol} td[data-label=State]")
        page.goto(f"{live.url}/engine/")
        layer = page.inner_text(f"[data-layer={blocked}]")
        assert "cannot run" in layer and "serving" not in layer.replace("cannot run", "")
        assert "No configured plugin can serve" in page.inner_text("[data-serving-summary]")
        status, reply = live.hook(H.INGEST, example_request(H.INGEST))
        assert reply["source"] == "default" and "launcher_not_found" in reply["fallback_reason"], reply
        page.goto(f"{live.url}/doctor/")
        assert "runtime_unknown" in page.inner_text(f"#doctor-{cobol}")
        assert "Enabled, but cannot run" in page.inner_text(f"#doctor-{blocked}")


# ---- 7. uninstalled plugins on the engine metrics --------------------------------------------------------------

def test_it_shows_uninstalled_plugins_without_links_on_the_engine_page(live, logged_in_page):
    name = _unique("gone")
    _scaffold(live, name, "python", [H.INGEST])
    with ActiveEngine(live, plugin=name):
        status, reply = live.hook(H.INGEST, example_request(H.INGEST))
        assert reply["source"] == name
    page = logged_in_page

    def linked() -> int:  # calls are recorded in the background
        page.goto(f"{live.url}/engine/")
        return page.locator(f"#engine-hook-ingest a[href='/plugins/{name}/']").count()

    wait_until(linked, 30, f"the engine page to link {name}'s ingest calls")
    status, body = live.request("POST", "/api/plugins/uninstall", {"name": name})
    assert status == 200, body
    page.goto(f"{live.url}/engine/")
    row = page.locator("#engine-hook-ingest")
    assert f"{name} (uninstalled)" in row.inner_text()
    assert row.locator(f"a[href='/plugins/{name}/']").count() == 0


# ---- the plugin list, the create form, the test console, tokens, the stack editor (Chromium) ------------------

def _console_errors(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def test_it_keeps_the_plugin_table_columns_with_a_128_character_name(live, logged_in_page, screenshot_dir):
    long_name = ("n" + uuid.uuid4().hex + "x" * 128)[:128]
    _scaffold(live, long_name, "python", [H.INGEST])
    page = logged_in_page
    page.goto(f"{live.url}/")
    table = page.locator("table.plugins")
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 1280, width
    for label in ("Runtime", "State", "Calls (1 h)", "Errors", "p95"):
        box = table.locator("thead th", has_text=label).bounding_box()
        assert box and box["x"] + box["width"] <= 1280 and box["width"] > 20, (label, box)
    link = page.locator(f"#plugin-row-{long_name} a.plugin-name")
    assert link.get_attribute("title") == long_name
    page.screenshot(path=str(screenshot_dir / "truth-plugins-long-name-1280.png"), full_page=True)
    page.goto(f"{live.url}/plugins/{long_name}/")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 1280


def test_it_sorts_and_searches_the_plugin_list(live, logged_in_page):
    a, b = _unique("aaa-sort"), _unique("zzz-sort")
    _scaffold(live, a, "python", [H.INGEST])
    _scaffold(live, b, "bash", [H.INGEST])
    page = logged_in_page
    page.goto(f"{live.url}/")
    page.fill("#plugin-search", b)
    page.wait_for_function(f"() => document.querySelectorAll('#plugin-rows tr[data-plugin]').length === 1 && "
                           f"document.querySelector('#plugin-rows tr[data-plugin]').dataset.plugin === '{b}'")
    assert f"q={b}" in page.url
    page.fill("#plugin-search", "-sort")
    page.wait_for_selector("th a.sort-link[href*='q=-sort']")  # the searched table has arrived
    names = lambda: page.eval_on_selector_all("#plugin-rows tr[data-plugin]", "rs => rs.map(r => r.dataset.plugin)")  # noqa: E731
    assert names().index(a) < names().index(b)
    page.click("th a.sort-link:has-text('Plugin')")  # already sorted by name: reverses
    page.wait_for_selector("th[aria-sort=descending] a:has-text('Plugin')")
    assert names().index(b) < names().index(a)
    page.click("th a.sort-link:has-text('Runtime')")
    page.wait_for_selector("th[aria-sort=ascending] a:has-text('Runtime')")
    assert names().index(b) < names().index(a)  # bash before python
    # a search after sorting keeps the sort
    page.fill("#plugin-search", "sort")
    page.wait_for_selector("th a.sort-link[href*='q=sort']")
    page.wait_for_selector("th[aria-sort=ascending] a:has-text('Runtime')")
    assert names().index(b) < names().index(a)
    # an empty list shows no orphan table header
    page.evaluate("() => document.querySelectorAll('#plugin-rows tr').forEach(r => r.remove())")
    assert page.eval_on_selector("table.plugins", "t => getComputedStyle(t).display") == "none"


def test_it_validates_the_create_form_in_chromium_and_asks_for_author(live, logged_in_page):
    page = logged_in_page
    errors = _console_errors(page)
    page.goto(f"{live.url}/create/")
    compiles = page.eval_on_selector("#id_name", "el => { try { new RegExp(el.pattern, 'v'); return true } "
                                                 "catch (e) { return String(e) } }")
    assert compiles is True
    assert page.eval_on_selector("#id_name", "el => { el.value = '-bad'; return el.validity.patternMismatch }")
    assert page.eval_on_selector("#id_name", "el => { el.value = 'good-name_1'; return el.validity.valid }")
    # only the chosen runtime's "not installed" hint shows
    missing = next((t for t in ("deno", "bun", "go", "v") if not _installed(t)), None)
    visible = lambda: page.eval_on_selector_all("[data-runtime-hint]", "els => els.filter(e => !e.hidden).map(e => e.dataset.runtimeHint)")  # noqa: E731
    page.select_option("#id_runtime", "python")
    assert visible() == []
    if missing:
        page.select_option("#id_runtime", missing)
        assert visible() == [missing]
        page.select_option("#id_runtime", "python")
    name = _unique("formmade")
    page.fill("#id_name", name)
    page.fill("#id_description", "made by the form")
    page.fill("#id_author", "Ada Lovelace")
    page.click("form[action='/create/'] button[type=submit]")
    page.wait_for_url(f"{live.url}/plugins/{name}/")
    assert 'author = "Ada Lovelace"' in (live.home / "plugins" / name / "plugin.toml").read_text()
    assert "manifest.no_author" not in page.content() and "manifest.no_description" not in page.content()
    assert errors == []


def test_it_keeps_focus_in_the_test_console_without_console_errors(live, logged_in_page, screenshot_dir):
    name = _unique("console")
    _scaffold(live, name, "python", [H.INGEST, H.ASSEMBLE])
    page = logged_in_page
    errors = _console_errors(page)
    page.goto(f"{live.url}/plugins/{name}/")
    page.select_option("#test-hook", H.ASSEMBLE)
    page.wait_for_function("() => document.querySelector('#test-payload').value.includes('messages')")
    page.focus("#test-run")
    page.keyboard.press("Enter")
    page.wait_for_selector("#test-result .test-result")
    page.wait_for_function("() => document.activeElement && document.activeElement.id === 'test-run'")
    assert page.get_attribute("#test-result .test-result", "data-ok") == "true"
    assert "would use this reply" in page.inner_text("[data-test-verdict]")
    page.keyboard.press("Enter")  # still focused: a second run starts from the keyboard
    page.wait_for_function("() => document.activeElement && document.activeElement.id === 'test-run'")
    page.screenshot(path=str(screenshot_dir / "truth-plugin-detail-1280.png"), full_page=True)
    assert errors == [], errors


def test_it_offers_curl_snippets_that_work_as_written(live, logged_in_page):
    name = _unique("curl")
    _scaffold(live, name, "python", [H.INGEST])
    page = logged_in_page
    page.goto(f"{live.url}/plugins/{name}/")
    snippet = page.inner_text("#curl-test-ingest")
    assert snippet.startswith(f"curl -sS -X POST {live.url}/api/plugins/{name}/test-hook")
    assert page.locator("[data-copy='#curl-test-ingest']").count() == 1
    out = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LIBREFANG_TOKEN": live.token})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ok"] is True
    agent = page.inner_text("#curl-agent-ingest")
    out = subprocess.run(["bash", "-c", agent], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LIBREFANG_TOKEN": live.token})
    assert json.loads(out.stdout)["type"] == "ingest_result"


def test_it_shows_a_new_token_once_with_a_copy_button_and_confirms_revoking(live, logged_in_page):
    page = logged_in_page
    page.goto(f"{live.url}/tokens/")
    token_name = _unique("tok")
    page.fill("#id_tname", token_name)
    page.select_option("#id_role", "viewer")
    page.click("form[action='/tokens/new/'] button[type=submit]")
    page.wait_for_url(f"{live.url}/tokens/")
    raw = page.inner_text("#new-token-value").strip()
    status, _ = live.request("GET", "/api/plugins", token=raw)
    assert status == 200
    page.click("[data-copy='#new-token-value']")
    page.wait_for_selector("[data-copy='#new-token-value']:has-text('Copied')")
    page.reload()
    assert page.locator("#new-token-value").count() == 0
    assert page.locator(f"tr[id^=token-]:has-text('{token_name}')").count() == 1
    messages = []
    page.once("dialog", lambda d: (messages.append(d.message), d.dismiss()))
    page.click(f"tr[id^=token-]:has-text('{token_name}') button:has-text('Revoke')")
    assert messages and "cannot be undone" in messages[0]
    assert live.request("GET", "/api/plugins", token=raw)[0] == 200  # dismissed: still valid
    page.once("dialog", lambda d: d.accept())
    page.click(f"tr[id^=token-]:has-text('{token_name}') button:has-text('Revoke')")
    page.wait_for_selector("text=is revoked")
    assert live.request("GET", "/api/plugins", token=raw)[0] == 401


def test_it_edits_the_stack_by_keyboard_and_drag_and_drop(live, logged_in_page, screenshot_dir):
    first, second = _unique("layer-a"), _unique("layer-b")
    _scaffold(live, first, "python", [H.INGEST])
    _scaffold(live, second, "python", [H.INGEST])
    page = logged_in_page
    errors = _console_errors(page)
    try:
        page.goto(f"{live.url}/engine/")
        page.check("input[name=mode][value=stack]")
        assert page.is_hidden("[data-stack-text]") and page.is_visible("[data-stack-editor]")
        # keyboard: add both, then move the second above the first
        page.focus(f"#stack-available li[data-name='{first}']")
        page.keyboard.press("Enter")
        page.focus(f"#stack-available li[data-name='{second}']")
        page.keyboard.press("Enter")
        page.focus(f"#stack-order li[data-name='{second}']")
        page.keyboard.press("Alt+ArrowUp")
        assert page.input_value("#id_stack") == f"{second}, {first}"
        assert "position 1" in page.inner_text("[data-stack-announce]")
        # drag and drop: put the first back on top
        page.drag_and_drop(f"#stack-order li[data-name='{first}']", f"#stack-order li[data-name='{second}']",
                           target_position={"x": 10, "y": 2})
        assert page.input_value("#id_stack") == f"{first}, {second}"
        page.screenshot(path=str(screenshot_dir / "truth-engine-stack-1280.png"), full_page=True)
        page.click("#engine-config-form button[type=submit]")
        page.wait_for_selector("#engine-config-form .notice-ok")
        status, cfg = live.request("GET", "/api/context-engine/config")
        assert cfg["plugin_stack"] == [first, second], cfg
        assert page.is_visible("[data-stack-editor]")  # re-initialised after the htmx swap
    finally:
        live.request("PUT", "/api/context-engine/config", {"plugin": None, "plugin_stack": None})
    assert errors == [], errors


PAGES = [("plugins", "/"), ("create", "/create/"), ("engine", "/engine/"), ("doctor", "/doctor/"),
         ("tokens", "/tokens/")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 390])
def test_it_renders_my_pages_without_horizontal_scroll(live, browser, width, scheme, screenshot_dir):
    name = _unique("shot")
    _scaffold(live, name, "python", [H.INGEST, H.ASSEMBLE])
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    try:
        page.goto(live.url + "/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", live.password)
        page.click("button[type=submit]")
        page.wait_for_url(live.url + "/")
        for label, path in [*PAGES, ("detail", f"/plugins/{name}/")]:
            page.goto(live.url + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(screenshot_dir / f"truth-{label}-{width}-{scheme}.png"), full_page=True)
            overflow = page.evaluate("() => document.documentElement.scrollWidth")
            assert overflow <= width + 1, (path, overflow)
    finally:
        context.close()
