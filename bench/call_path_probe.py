"""The probe of bench/call_path.py, copied into a directory of its own as `sitecustomize.py` and put on PYTHONPATH,
so that every python process of the service imports it at start: daphne, the worker and the zygotes (a python hook
gets the worker's PYTHONPATH, and its zygote starts with it).

With `call_path.json` beside it, it records, for every python frame that starts or resumes in a file under one of
the repository's package roots, the file and the millisecond (CLOCK_MONOTONIC, the same in every process), once per
file and millisecond, into a file of its process's own. A forked child writes into `child_out` instead (the plugin's
data directory: the one place a sandboxed hook may write, at the same path inside its view and outside), reopened
when the sandbox closed its descriptor. Without the json, it does nothing.
"""

import json
import os
import sys
import threading
import time


def _install() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, "call_path.json")) as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return
    roots = tuple(config["roots"])
    functions = bool(config.get("functions"))  # record file and function (bench/call_path.py --functions)
    state = {"dir": config["out"], "name": f"{os.getpid()}-{os.urandom(4).hex()}", "path": "", "fd": -1,
             "ino": None, "last": {}, "parent": "", "kept": None}

    def open_log() -> None:
        try:
            os.mkdir(state["dir"], 0o777)
            os.chmod(state["dir"], 0o777)  # the hook's identity and root (its keeper) both write there
        except FileExistsError:
            pass
        if not state["path"]:
            state["path"] = os.path.join(state["dir"], state["name"] + ".log")
            header = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:3], "parent": state["parent"]}
            first = (json.dumps(header) + "\n").encode()
        else:
            first = b""
        fd = os.open(state["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        os.fchmod(fd, 0o666)
        state["fd"], state["ino"] = fd, os.fstat(fd).st_ino
        if first:
            os.write(fd, first)

    def emit(data: bytes) -> bool:
        try:
            if state["fd"] < 0 or os.fstat(state["fd"]).st_ino != state["ino"]:
                open_log()  # first record, or the sandbox closed (and maybe reused) the descriptor
            os.write(state["fd"], data)
            return True
        except OSError:
            state["fd"] = -1
            return False

    def write(line: bytes) -> None:
        if state["kept"] is not None:
            state["kept"].append(line)  # a child: written at its next os.kill or os._exit
        else:
            emit(line)

    def trace(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(roots):
                if functions:
                    path = f"{path}:{frame.f_code.co_name}"
                ms = int(time.monotonic() * 1000)
                if state["last"].get(path) != ms:
                    state["last"][path] = ms
                    write(f"{ms}\t{path}\n".encode())
        return None

    def after_fork() -> None:
        state.update(parent=state["name"], name=f"{os.getpid()}-{os.urandom(4).hex()}",
                     dir=config.get("child_out") or config["out"], path="", fd=-1, ino=None, last={}, kept=[])

    def flush() -> None:
        if state["kept"] and emit(b"".join(state["kept"])):
            state["kept"].clear()

    real_exit, real_kill = os._exit, os.kill

    def exit_writing_records(status):
        flush()
        real_exit(status)

    def kill_writing_records(pid, sig):  # a warm hook says it is done with a signal, and is killed right after
        flush()
        real_kill(pid, sig)

    os._exit, os.kill = exit_writing_records, kill_writing_records
    os.register_at_fork(after_in_child=after_fork)
    sys.settrace(trace)
    threading.settrace(trace)


_install()
