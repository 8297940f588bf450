"""engine.install on disk: symlinks never copied (files or directories), lockfile change detection, sources."""

import os

import pytest

from engine.home import Home
from engine.install import (
    InstallError,
    Lockfile,
    Source,
    copy_tree,
    file_hashes,
    install,
    local_changes,
    uninstall,
)
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin


def test_it_copies_without_symlinks_and_hashes_every_file(tmp_path):
    src = make_plugin(tmp_path / "src", "p", {"ingest": PY_ECHO_INGEST})
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("s")
    os.symlink(tmp_path / "outside", src / "linkdir")
    os.symlink(tmp_path / "outside/secret", src / "hooks/linkfile")
    (src / ".git").mkdir()
    (src / ".git/config").write_text("x")
    skipped = copy_tree(src, tmp_path / "dst")
    assert sorted(skipped) == ["hooks/linkfile", "linkdir"]
    assert set(file_hashes(tmp_path / "dst")) == {"plugin.toml", "hooks/ingest.py"}


def test_it_detects_modified_added_and_removed_files(tmp_path):
    home = Home(tmp_path / "home")
    src = make_plugin(tmp_path / "src", "p", {"ingest": PY_ECHO_INGEST})
    (src / "extra.txt").write_text("e")
    install(home, Source("local", path=str(src)))
    entry = Lockfile(home).entry("p")
    pdir = home.plugin_dir("p")
    assert local_changes(pdir, entry["files"]) == {"modified": [], "removed": [], "added": []}
    (pdir / "hooks/ingest.py").write_text("changed")
    (pdir / "extra.txt").unlink()
    (pdir / "new.txt").write_text("n")
    (pdir / ".disabled").touch()  # state markers are not edits
    assert local_changes(pdir, entry["files"]) == {"modified": ["hooks/ingest.py"], "removed": ["extra.txt"],
                                                   "added": ["new.txt"]}
    assert uninstall(home, "p")["was_locked"] is True
    assert Lockfile(home).entry("p") is None
    with pytest.raises(InstallError) as exc:
        uninstall(home, "p")
    assert exc.value.status == 404


def test_it_refuses_a_name_mismatch_from_a_registry(tmp_path):
    home = Home(tmp_path / "home")
    reg = tmp_path / "reg"
    pdir = make_plugin(reg / "plugins", "wanted", {"ingest": PY_ECHO_INGEST})
    toml = pdir / "plugin.toml"
    toml.write_text(toml.read_text().replace('name = "wanted"', 'name = "other"'))
    with pytest.raises(InstallError) as exc:
        install(home, Source("registry", registry=str(reg), name="wanted"))
    assert exc.value.code == "name_mismatch"
    assert not [p for p in (home.plugins_dir).iterdir()]


@pytest.mark.parametrize("data", [
    None, {}, {"source": "git", "url": "git@host:repo.git", "ref": "--evil"}, {"source": "registry", "name": 3},
    {"source": "registry", "name": "ok", "registry": 5},
])
def test_it_rejects_malformed_sources(data):
    with pytest.raises(InstallError):
        Source.parse(data)
