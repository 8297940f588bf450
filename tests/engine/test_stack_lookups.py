"""engine/stack.py looks each plugin up once per call (Catalog.get checks the directory and integrity every time),
and every call looks again: a change between two calls is seen by the second."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from engine.hooks import timeout_for
from engine.plugins.catalog import DISABLED_MARKER
from tests.engine.test_conformance_hooks import recorder
from tests.plugin_factory import make_plugin, write_config


class CountingCatalog:
    def __init__(self, catalog):
        self.catalog = catalog
        self.home = catalog.home
        self.gets: Counter[str] = Counter()

    def exists(self, name):
        return self.catalog.exists(name)

    def get(self, name):
        entry = self.catalog.get(name)  # KeyError for one not installed: not counted
        self.gets[name] += 1
        return entry

    def names(self):
        return self.catalog.names()


def test_one_call_looks_each_layer_up_once_and_the_next_call_looks_again(engine, ehome):
    for name, memory in (("one", "A"), ("two", "B")):
        reply = f'{{"memories": [{{"content": "{memory}"}}]}}'
        make_plugin(ehome.plugins_dir, name, {"ingest": recorder("ingest", reply),
                                              "assemble": recorder("assemble", '{"messages": []}')})
    write_config(ehome.root, stack=["one", "two", "missing"])
    counting = engine.catalog = CountingCatalog(engine.catalog)

    reply = engine.handle("ingest", {"agent_id": "a", "message": "m"})
    assert [m["content"] for m in reply.result["memories"]] == ["A", "B"] and reply.source == "one,two"
    assert counting.gets == {"one": 1, "two": 1}
    # assemble: both layers fail (empty list), so the failure policy is read too: still one lookup each
    reply = engine.handle("assemble", {"agent_id": "a", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.source == "default" and "one:" in reply.fallback_reason and "two:" in reply.fallback_reason
    assert counting.gets == {"one": 2, "two": 2}

    assert engine.deadline_secs("ingest") > 0 and counting.gets == {"one": 3, "two": 3}  # chain, then timeouts

    (ehome.plugins_dir / "two" / DISABLED_MARKER).touch()
    reply = engine.handle("ingest", {"agent_id": "a", "message": "m"})
    assert reply.source == "one" and [m["content"] for m in reply.result["memories"]] == ["A"]


def test_a_deadline_reads_only_manifests_and_sees_every_change_of_one(engine, ehome):
    """Catalog.peek (the deadline's lookup) takes a plugin.toml unchanged since it loaded as it is: a tampered hook
    makes `get` refuse the plugin ([integrity]), while the deadline still counts its timeout (an upper bound: the
    worker refuses at once); a changed plugin.toml, a disabled or an uninstalled plugin are seen at once."""
    pdir = make_plugin(ehome.plugins_dir, "slow", {"ingest": recorder("ingest", '{"memories": []}')},
                       toml_extra="hook_timeout_secs = 7")
    hook = pdir / "hooks" / "ingest.py"
    original = hook.read_bytes()
    digest = hashlib.sha256(original).hexdigest()
    manifest = pdir / "plugin.toml"
    manifest.write_text(manifest.read_text() + f'\n[integrity]\n"hooks/ingest.py" = "{digest}"\n')
    write_config(ehome.root, stack=["slow"])
    catalog = engine.catalog
    assert catalog.get("slow").plugin is not None and engine.deadline_secs("ingest") == 7

    hook.write_bytes(original + b"\n# tampered\n")
    assert catalog.get("slow").plugin is None
    assert catalog.peek("slow").plugin is not None and engine.deadline_secs("ingest") == 7

    hook.write_bytes(original)
    manifest.write_text(manifest.read_text().replace("hook_timeout_secs = 7", "hook_timeout_secs = 12"))
    assert engine.deadline_secs("ingest") == 12

    (pdir / DISABLED_MARKER).touch()
    assert engine.deadline_secs("ingest") == timeout_for("ingest") != 12
    manifest.unlink()
    with pytest.raises(KeyError):
        catalog.peek("slow")
