"""engine/filecache.py real_path: the kernel's name for a path that exists, os.path.realpath's answer always (the
hook path checks, confine and the sandbox's kept directories rely on it)."""

from __future__ import annotations

import os

from engine.filecache import real_path


def test_it_gives_realpaths_answer_for_every_kind_of_path(tmp_path, monkeypatch):
    deep = tmp_path / "a" / "b c" / "d"
    deep.mkdir(parents=True)
    (deep / "hook.py").write_text("")
    os.symlink(deep, tmp_path / "link")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")  # O_PATH opens it without waiting for a writer
    monkeypatch.chdir(deep)
    paths = [deep, deep / "hook.py", tmp_path / "link", tmp_path / "link" / "hook.py", tmp_path / "link" / "..",
             tmp_path / "link" / ".." / "missing", tmp_path / "missing" / "x", tmp_path / "dangling",
             tmp_path / "loop", tmp_path / "fifo", "hook.py", "..", ".", "/", "/proc/self"]
    for path in paths:
        assert real_path(path) == os.path.realpath(path), path
    assert real_path(tmp_path / "link" / "hook.py") == str(deep / "hook.py")
