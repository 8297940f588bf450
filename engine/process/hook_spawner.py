"""The cold-hook spawner: run as a *script* by the worker's own interpreter (never imported by the worker).

A hook that is not forked from a python zygote is exec'd by this small, stdlib-only process instead of the worker:
the worker (hundreds of MB, many threads) never fork()s itself for a hook, and the spawner keeps a spare child
that has already joined its cgroup (engine/process/zygote_serve.py `ZygoteLoop`, the same loop as the zygote's). Its
child applies the hook's sandbox (engine/process/sandbox.py `enter`) and execs the hook's program
(engine/process/zygote_child.py `exec_hook`). Started and driven by engine/process/warmstart.py (`spawn_exec`); argv: control socket fd, path of
engine/process/sandbox.py.

Its own file name is not the zygote's: a hook can tell that it was forked warm by its init's command line
(tests/engine/test_warmstart.py), and an exec'd hook was not.
"""

import os
from importlib.util import module_from_spec, spec_from_file_location

if __name__ == "__main__":
    _found = spec_from_file_location("librefang_zygote",
                                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "warmstart_zygote.py"))
    _zygote = module_from_spec(_found)
    _found.loader.exec_module(_zygote)
    _zygote.main(exec_mode=True)
    os._exit(0)  # never reached: main returns only in a child, which execs or exits
