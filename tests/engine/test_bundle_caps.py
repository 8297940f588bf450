"""A bundle (engine/plugins/bundles.py) unpacks to no more than a plugin may bring: its headers are checked against
the install caps (engine/plugins/sources.py) before anything is written."""

from __future__ import annotations

import io
import tarfile

import pytest

from engine.plugins import bundles as B
from engine.plugins.sources import MAX_FILES


def test_it_refuses_a_bundle_with_more_files_than_a_plugin_may_have(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for n in range(MAX_FILES + 1):
            info = tarfile.TarInfo(f"f{n}.txt")
            tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(B.BundleError, match=f"more than {MAX_FILES} files"):
        B.materialise(tmp_path / "cache", "0" * 64, "many", buf.getvalue())
    assert not (tmp_path / "cache" / ("0" * 64)).exists()
