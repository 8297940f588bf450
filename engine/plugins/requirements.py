"""`requirements`: a plugin's Python dependencies, installed into its own virtualenv under its data dir.

LibreFang runs `python -m pip install --user -r requirements.txt` with no timeout, which mixes every plugin's
dependencies into one user site and can hang forever. Here each plugin gets `<data_dir>/venv`, built next to the
old one and swapped in only when the install succeeded (a failed install loses nothing), all within `timeout`.
Python hooks of a plugin that has a venv run with the venv's interpreter (VIRTUAL_ENV and PATH set; see runner).

pip runs the plugin's packages' own build code (`setup.py`): the whole build runs in the hook sandbox
(engine/process/sandboxed_command.py) as the plugin's identity, with network, writing only the new venv
(`venv.new`), the service's files (tokens, keys, code) out of sight. Only the swap into place is done outside.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, NamedTuple

from engine.filecache import confine
from engine.plugins.loader import read_manifest
from engine.process import data_disks, plugin_files, sandboxed_command
from engine.process.runner import DEFAULT_MAX_DISK_MB
from engine.process.runtimes import find_launcher

OUTPUT_TAIL_CHARS = 64 * 1024
DEFAULT_TIMEOUT_SECS = 300.0
DEFAULT_REQUIREMENTS = "requirements.txt"
# What install_requirements keeps in the plugin's data dir: installed code, not the plugin's state.
VENV_DIRS = ("venv", "venv.new", "venv.old")


def requirements_file(plugin_dir: Path) -> Path | None:
    """The plugin's requirements file: `requirements = "<path>"` in plugin.toml, else requirements.txt.

    Raises ValueError when the declared path leaves the plugin directory.
    """
    manifest = read_manifest(plugin_dir)
    declared = manifest.requirements if manifest is not None and (manifest.requirements or "").strip() else None
    target = confine(plugin_dir, declared or DEFAULT_REQUIREMENTS, "requirements path", "the plugin directory")
    return target if target.is_file() else None


class InstallResult(NamedTuple):
    """(ok, output); also a dict for the API via to_dict()."""

    ok: bool
    output: str

    def to_dict(self) -> dict:
        out: dict = {"ok": self.ok, "success": self.ok, "output": self.output}
        if not self.ok:
            lines = [line for line in self.output.strip().splitlines() if line.strip()]
            out["error"] = lines[-1] if lines else "installing requirements failed"
        return out


def install_requirements(plugin_dir: Path, data_dir: Any, timeout: Any = DEFAULT_TIMEOUT_SECS, *,
                         disk_mb: int = DEFAULT_MAX_DISK_MB) -> InstallResult:
    """Create `<data_dir>/venv` and pip-install the plugin's requirements into it. Returns (ok, output). The venv
    is on the data directory's own filesystem of `disk_mb` (the operator's [limits] max_disk_mb), with the rest of
    what the plugin keeps there (engine/process/data_disks.py).

    Also accepts `(plugin_dir, manifest, home)` (data dir = home.data_dir(manifest.name), default timeout).
    """
    if hasattr(data_dir, "requirements") and hasattr(timeout, "data_dir"):
        data_dir, timeout = timeout.data_dir(data_dir.name), DEFAULT_TIMEOUT_SECS
    return InstallResult(*_install(Path(plugin_dir), Path(data_dir), float(timeout), disk_mb))


def _install(plugin_dir: Path, data_dir: Path, timeout: float, disk_mb: int) -> tuple[bool, str]:
    try:
        req = requirements_file(plugin_dir)
    except ValueError as exc:
        return False, str(exc)
    if req is None:
        return True, "No requirements.txt found — nothing to install"
    python = find_launcher("python")
    if python is None:
        return False, "no python interpreter found (python3, python, py) to build the plugin's virtualenv"
    final, staging, backup = (data_dir / name for name in VENV_DIRS)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        data_disks.ensure(data_dir, disk_mb)
        _discard(staging)
        staging.mkdir(mode=0o700)
    except OSError as exc:
        return False, f"cannot prepare {staging}: {exc}"
    pip = _service_pip()
    argv = [python, "-c", _BUILD, str(staging), str(final), str(req), pip or ""]
    ok, out = sandboxed_command.run(sandboxed_command.Command(
        argv=argv, cwd=plugin_dir, plugin=plugin_dir.name, env=_install_env(), writable=(staging,),
        read_only=(pip,) if pip else (), network=True, home_dir=_home_of(data_dir)), timeout)
    log = ["$ " + " ".join(argv[:2] + ["<build the venv>"] + argv[3:]) + "\n" + out]
    if not ok:
        try:
            _discard(staging)
        except OSError as exc:
            log.append(f"cannot remove {staging}: {exc}")
        return False, _tail(log)
    try:  # the swap, outside the sandbox: renames in the plugin's own directory, following no link
        _discard(backup)
        if os.path.lexists(final):
            os.rename(final, backup)
        os.rename(staging, final)
        _discard(backup)
    except OSError as exc:
        return False, _tail(log + [f"cannot put the new venv in place: {exc}"])
    return True, _tail(log + [f"installed into {final}"])


# Run inside the sandbox as the plugin's identity (argv: staging venv, its final path, requirements file, the
# service's pip package directory or ""): the venv, its packages, and console scripts pointed at the final path.
_BUILD = r"""
import os, subprocess, sys
staging, final, req, pip = sys.argv[1:5]
def run(argv):
    print("$ " + " ".join(argv), flush=True)
    if subprocess.run(argv).returncode:
        sys.exit(1)
run([sys.executable, "-m", "venv", "--without-pip", staging])
python = os.path.join(staging, "bin", "python")
install = ["install", "--disable-pip-version-check", "--no-input", "--no-cache-dir", "-r", req]
if pip:
    run([sys.executable, pip, "--python", python, *install])
else:
    run([python, "-m", "ensurepip", "--default-pip"])
    run([python, "-m", "pip", *install])
old, new = ("#!" + staging + "/").encode(), ("#!" + final + "/").encode()
bin_dir = os.path.join(staging, "bin")
for name in os.listdir(bin_dir):
    path = os.path.join(bin_dir, name)
    if os.path.islink(path) or not os.path.isfile(path):
        continue
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(old):
        with open(path, "wb") as fh:
            fh.write(new + data[len(old):])
"""


def _service_pip() -> str | None:
    """The service's own pip package (run by the plugin's interpreter with --python: fast, no download), if any."""
    found = importlib.util.find_spec("pip")
    if found is None or not found.submodule_search_locations:
        return None
    return os.path.realpath(list(found.submodule_search_locations)[0])


def _install_env() -> dict[str, str]:
    """What pip gets: a private HOME and TMPDIR, the locale, and the operator's pip and proxy settings; nothing else of
    the service's environment."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp", "TMPDIR": "/tmp",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for key, value in os.environ.items():
        if key in ("LANG", "LC_ALL") or key.startswith("PIP_") or key.lower() in _PROXY_VARS:
            env[key] = value
    return env


_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


def _home_of(data_dir: Path) -> Path | None:
    """$LIBREFANG_HOME of a data directory in its usual place (`<home>/plugin_data/<name>`), else None (the env's)."""
    return data_dir.parent.parent if data_dir.parent.name == "plugin_data" else None


def _discard(path: Path) -> None:
    """Remove `path` whatever it is (a link is removed, never followed: the plugin's hooks may have put one there),
    with what the build wrote there as the plugin's identity."""
    plugin_files.discard(path)


def _tail(parts: list[str]) -> str:
    text = "\n".join(parts)
    return text[-OUTPUT_TAIL_CHARS:]
