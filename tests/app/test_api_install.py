"""engine/plugins/install.py on disk: symlinks never copied (files or directories), lockfile change detection, sources."""

import os

import pytest

from engine.home import Home
from engine.plugins.install import Lockfile, install, local_changes, uninstall
from engine.plugins.sources import InstallError, Source, copy_tree, file_hashes
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


# ---- registry trust: an Ed25519-signed index.json (engine/plugins/registry.py) ----

def _keypair():
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(pub).decode()


def _signed_registry(tmp_path, key, names=("good",), listed=("good",), files=None):
    import base64
    import json as _json

    reg = tmp_path / "reg"
    for n in names:
        make_plugin(reg / "plugins", n, {"ingest": PY_ECHO_INGEST})
    # every file listed with its hash (`files` overrides some), as a signed index must
    index = _json.dumps({"plugins": [{"name": n, "version": "0.1.0",
                                      "files": {**file_hashes(reg / "plugins" / n), **(files or {})}}
                                     for n in listed]}).encode()
    (reg / "index.json").write_bytes(index)
    if key is not None:
        (reg / "index.json.sig").write_text(base64.b64encode(key.sign(index)).decode())
    return reg


def test_it_installs_from_a_registry_whose_signed_index_lists_the_plugin(tmp_path):
    from engine.plugins.registry import RegistryConfig

    key, pub = _keypair()
    reg = _signed_registry(tmp_path, key)
    home = Home(tmp_path / "home")
    result = install(home, Source("registry", registry=str(reg), name="good"), None,
                     [RegistryConfig(str(reg), "mine", pub)])
    assert result["installed"] and Lockfile(home).entry("good")["provenance"]["index_signed"] is True


@pytest.mark.parametrize("tamper,code", [
    ("unsigned", "registry_unsigned"),
    ("wrong_key", "registry_signature_invalid"),
    ("edited_index", "registry_signature_invalid"),
    ("garbage_sig", "registry_signature_invalid"),
    ("not_listed", "registry_not_listed"),
    ("file_hash", "registry_file_mismatch"),
    ("no_index", "registry_unsigned"),
])
def test_it_refuses_an_index_that_is_unsigned_or_badly_signed_when_a_key_is_configured(tmp_path, tamper, code):
    from engine.plugins.registry import RegistryConfig

    key, pub = _keypair()
    other_key, _ = _keypair()
    reg = _signed_registry(
        tmp_path, None if tamper == "unsigned" else other_key if tamper == "wrong_key" else key,
        names=("good", "sneaky"), listed=("good",),
        files={"hooks/ingest.py": "0" * 64} if tamper == "file_hash" else None)
    if tamper == "edited_index":
        (reg / "index.json").write_text('{"plugins": [{"name": "good"}, {"name": "sneaky"}]}')
    if tamper == "garbage_sig":
        (reg / "index.json.sig").write_text("not base64 at all!")
    if tamper == "no_index":
        (reg / "index.json").unlink()
        (reg / "index.json.sig").unlink()
    home = Home(tmp_path / "home")
    with pytest.raises(InstallError) as exc:
        install(home, Source("registry", registry=str(reg), name="sneaky" if tamper == "not_listed" else "good"),
                None, [RegistryConfig(str(reg), "mine", pub)])
    assert exc.value.code == code
    assert not (home.plugins_dir.exists() and list(home.plugins_dir.iterdir()))
    assert Lockfile(home).read()["plugins"] == {}


def test_it_accepts_an_unsigned_index_only_when_the_operator_does_not_require_signatures(tmp_path):
    from engine.plugins.registry import RegistryConfig

    key, pub = _keypair()
    reg = _signed_registry(tmp_path, None)
    home = Home(tmp_path / "home")
    install(home, Source("registry", registry=str(reg), name="good"), None,
            [RegistryConfig(str(reg), "mine", pub, require_signature=False)])
    assert Lockfile(home).entry("good")["provenance"]["index_signed"] is False
    # a bad signature is refused even then
    (reg / "index.json.sig").write_text("AAAA")
    uninstall(home, "good")
    with pytest.raises(InstallError) as exc:
        install(home, Source("registry", registry=str(reg), name="good"), None,
                [RegistryConfig(str(reg), "mine", pub, require_signature=False)])
    assert exc.value.code == "registry_signature_invalid"
    # signatures required but no key to check them with: refused, never silently trusted
    with pytest.raises(InstallError) as exc:
        install(home, Source("registry", registry=str(reg), name="good"), None,
                [RegistryConfig(str(reg), "mine", None, require_signature=True)])
    assert exc.value.code == "registry_key_missing"


def test_it_installs_a_plugin_whose_dependencies_are_installed_and_refuses_it_otherwise(tmp_path):
    home = Home(tmp_path / "home")
    src = make_plugin(tmp_path / "src", "needy", {"ingest": PY_ECHO_INGEST}, top_extra='plugin_depends = ["base"]')
    with pytest.raises(InstallError) as exc:
        install(home, Source("local", path=str(src)))
    assert exc.value.code == "invalid_manifest" and "'base' is not installed" in exc.value.message
    install(home, Source("local", path=str(make_plugin(tmp_path / "src2", "base", {"ingest": PY_ECHO_INGEST}))))
    assert install(home, Source("local", path=str(src)))["installed"]


def test_it_refuses_to_install_a_name_that_differs_from_an_installed_one_only_by_case(tmp_path):
    home = Home(tmp_path / "home")
    install(home, Source("local", path=str(make_plugin(tmp_path / "a", "uxpy", {"ingest": PY_ECHO_INGEST}))))
    with pytest.raises(InstallError) as refused:
        install(home, Source("local", path=str(make_plugin(tmp_path / "b", "UxPy", {"ingest": PY_ECHO_INGEST}))))
    assert refused.value.code == "already_installed" and "'uxpy'" in str(refused.value)
    assert sorted(p.name for p in home.plugins_dir.iterdir()) == ["uxpy"]
