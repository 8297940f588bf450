"""Install sources a hostile plugin author controls, through the real API (engine/plugins/registry.py,
engine/plugins/sources.py): a registry's key applies however the registry is spelled, every file of a plugin from a
signed index must be listed with its hash, and a git repository may not expand past the size caps."""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.plugins.sources import MAX_FILE_BYTES, MAX_TOTAL_BYTES, file_hashes
from tests.plugin_factory import PY_ECHO_INGEST, make_plugin


def keypair() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(raw).decode()


def registry(root, name: str, signer: Ed25519PrivateKey):
    """A registry directory offering plugin `name`, its index listing every file, signed by `signer`."""
    make_plugin(root / "plugins", name, {"ingest": PY_ECHO_INGEST})
    index = json.dumps({"plugins": [{"name": name, "version": "0.1.0",
                                     "files": file_hashes(root / "plugins" / name)}]}).encode()
    (root / "index.json").write_bytes(index)
    (root / "index.json.sig").write_text(base64.b64encode(signer.sign(index)).decode())
    return root


def trust(live, location: str, public_key: str) -> None:
    (live.home / "config.toml").write_text(
        f'[plugins]\nplugin_registries = [{{name = "trusted", path = "{location}", public_key = "{public_key}"}}]\n')


def install(live, body: dict):
    return live.request("POST", "/api/plugins/install", body, timeout=120)


def test_a_registrys_key_applies_however_the_registry_is_spelled(live, tmp_path):
    _key, public = keypair()
    impostor, _ = keypair()
    reg = registry(tmp_path / "reg", "spelled", impostor)  # signed, but not with the operator's key
    trust(live, str(reg), public)
    os.symlink(reg, tmp_path / "alias")
    (tmp_path / "x").mkdir()
    for spelling in (f"{reg}/", f"{reg}/./", f"{tmp_path}/x/../reg", str(tmp_path / "alias"), "trusted", str(reg)):
        status, body = install(live, {"source": "registry", "registry": spelling, "name": "spelled"})
        assert status == 400 and body["error"]["code"] == "registry_signature_invalid", (spelling, body)
    assert not (live.home / "plugins" / "spelled").exists()


def test_a_file_the_signed_index_does_not_list_refuses_the_install(live, tmp_path):
    key, public = keypair()
    reg = registry(tmp_path / "reg", "padded", key)
    trust(live, str(reg), public)
    (reg / "plugins" / "padded" / "sitecustomize.py").write_text("import os  # added after signing\n")
    status, body = install(live, {"source": "registry", "registry": str(reg), "name": "padded"})
    assert status == 400 and body["error"]["code"] == "registry_file_unlisted", body
    assert "sitecustomize.py" in body["error"]["message"]
    assert not (live.home / "plugins" / "padded").exists()
    (reg / "plugins" / "padded" / "sitecustomize.py").unlink()
    status, body = install(live, {"source": "registry", "registry": str(reg), "name": "padded"})
    assert status == 201 and body["permissions"]["in_force"], body


@pytest.mark.timeout(300)
def test_a_git_repository_that_expands_past_the_caps_is_refused(live, tmp_path):
    repo = tmp_path / "bomb"
    make_plugin(repo, "bomb", {"ingest": PY_ECHO_INGEST})
    src = repo / "bomb"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    # files of zeros, each under the per-file cap, together over the total: a few hundred kB once packed
    size = MAX_FILE_BYTES - 1024
    blob = subprocess.run([*git, "-C", str(src), "hash-object", "-w", "--stdin"], input=b"\0" * size,
                          capture_output=True, check=True).stdout.decode().strip()
    for n in range(MAX_TOTAL_BYTES // size + 1):
        subprocess.run([*git, "-C", str(src), "update-index", "--add", "--cacheinfo", f"100644,{blob},zeros{n}.bin"],
                       check=True)
    subprocess.run([*git, "-C", str(src), "add", "plugin.toml", "hooks"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "bomb"], check=True)
    status, body = install(live, {"source": "git", "url": f"file://{src}"})
    assert status == 400 and body["error"]["code"] == "too_large", body
    assert not (live.home / "plugins" / "bomb").exists()
