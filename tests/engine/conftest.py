import pytest

from engine.home import Home
from engine.plugins.permissions import MemoryApprovals
from engine.process import warmstart
from engine.stack import ContextEngine, EngineDeps


class RecordingSink:
    def __init__(self):
        self.items = []

    def record(self, invocation):
        self.items.append(invocation)


class LineSink:
    def __init__(self):
        self.lines = []

    def line(self, plugin, hook, line, trace_id):
        self.lines.append((plugin, hook, line))


class ListMemory:
    def __init__(self):
        self.items = []

    def remember(self, agent_id, peer_id, content, scope="hook", tags=None, source=""):
        self.items.append({"agent_id": agent_id, "peer_id": peer_id, "content": content, "source": source})

    def recall(self, agent_id, peer_id, query, limit):
        words = {w for w in query.lower().split() if len(w) > 2}
        hits = [m for m in self.items if m["agent_id"] == agent_id and (not peer_id or m["peer_id"] in (peer_id, None))
                and words & set(m["content"].lower().split())]
        return [{"content": m["content"], "scope": "default_recall"} for m in hits[:limit]]


@pytest.fixture
def ehome(tmp_path):
    root = tmp_path / "lfhome"
    (root / "plugins").mkdir(parents=True)
    return Home(root)


@pytest.fixture
def sinks():
    return {"invocations": RecordingSink(), "stderr": LineSink(), "memory": ListMemory()}


@pytest.fixture
def approvals():
    """The owner's approvals as the `engine` fixture sees them (in the service: the database)."""
    return MemoryApprovals()


@pytest.fixture
def engine(ehome, sinks, approvals):
    return ContextEngine(EngineDeps(home=ehome, memory=sinks["memory"], invocations=sinks["invocations"],
                                    stderr=sinks["stderr"], approvals=approvals))


@pytest.fixture
def fresh_zygotes(monkeypatch):
    """Warm start on (whatever LIBREFANG_WARM_START says), and no zygote left from another test, before or after."""
    monkeypatch.delenv("LIBREFANG_WARM_START", raising=False)
    warmstart.shutdown()
    yield
    warmstart.shutdown()
