"""`requirements`: a plugin's Python dependencies, installed into its own virtualenv under its data dir.

LibreFang runs `python -m pip install --user -r requirements.txt` with no timeout, which mixes every plugin's
dependencies into one user site and can hang forever. Here each plugin gets `<data_dir>/venv`, built next to the
old one and swapped in only when the install succeeded (a failed install loses nothing), all within `timeout`.
Python hooks of a plugin that has a venv run with the venv's interpreter (VIRTUAL_ENV and PATH set; see runner).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from engine.filecache import confine
from engine.plugins.loader import read_manifest
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


def install_requirements(plugin_dir: Path, data_dir: Any, timeout: Any = DEFAULT_TIMEOUT_SECS) -> InstallResult:
    """Create `<data_dir>/venv` and pip-install the plugin's requirements into it. Returns (ok, output).

    Also accepts `(plugin_dir, manifest, home)` (data dir = home.data_dir(manifest.name), default timeout).
    """
    if hasattr(data_dir, "requirements") and hasattr(timeout, "data_dir"):
        data_dir, timeout = timeout.data_dir(data_dir.name), DEFAULT_TIMEOUT_SECS
    return InstallResult(*_install(Path(plugin_dir), Path(data_dir), float(timeout)))


def _install(plugin_dir: Path, data_dir: Path, timeout: float) -> tuple[bool, str]:
    try:
        req = requirements_file(plugin_dir)
    except ValueError as exc:
        return False, str(exc)
    if req is None:
        return True, "No requirements.txt found — nothing to install"
    python = find_launcher("python")
    if python is None:
        return False, "no python interpreter found (python3, python, py) to build the plugin's virtualenv"
    deadline = time.monotonic() + timeout
    data_dir.mkdir(parents=True, exist_ok=True)
    final = data_dir / VENV_DIRS[0]
    staging = data_dir / VENV_DIRS[1]
    shutil.rmtree(staging, ignore_errors=True)
    log: list[str] = []
    steps: list[list[str]] = [[python, "-m", "venv", "--without-pip", str(staging)]]
    venv_python = str(staging / "bin" / "python")
    if _has_pip(sys.executable):
        steps.append([sys.executable, "-m", "pip", "--python", venv_python, "install",
                      "--disable-pip-version-check", "--no-input", "-r", str(req)])
    else:
        steps.append([venv_python, "-m", "ensurepip", "--default-pip"])
        steps.append([venv_python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                      "-r", str(req)])
    for argv in steps:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            shutil.rmtree(staging, ignore_errors=True)
            return False, _tail(log + [f"timed out after {timeout:g}s"])
        ok, out = _run(argv, plugin_dir, remaining)
        log.append("$ " + " ".join(argv) + "\n" + out)
        if not ok:
            shutil.rmtree(staging, ignore_errors=True)
            return False, _tail(log)
    backup = data_dir / VENV_DIRS[2]
    shutil.rmtree(backup, ignore_errors=True)
    if final.exists():
        final.rename(backup)
    staging.rename(final)
    _fix_shebangs(final, staging)
    shutil.rmtree(backup, ignore_errors=True)
    return True, _tail(log + [f"installed into {final}"])


def _fix_shebangs(venv: Path, old: Path) -> None:
    """Console scripts were written with the staging path in their shebang; point them at the final venv."""
    old_prefix = f"#!{old}/".encode()
    new_prefix = f"#!{venv}/".encode()
    for script in (venv / "bin").iterdir():
        try:
            if script.is_symlink() or not script.is_file():
                continue
            data = script.read_bytes()
            if data.startswith(old_prefix):
                script.write_bytes(new_prefix + data[len(old_prefix):])
        except OSError:
            continue


def _has_pip(python: str) -> bool:
    try:
        return subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[bool, str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return False, f"cannot run {argv[0]}: {exc}"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return False, out.decode("utf-8", "replace") + f"\ntimed out after {timeout:.0f}s; killed"
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        return False, text + f"\nexit code {proc.returncode}"
    return True, text


def _tail(parts: list[str]) -> str:
    text = "\n".join(parts)
    return text[-OUTPUT_TAIL_CHARS:]
