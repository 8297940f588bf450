"""One hook call in its own process: the runtimes and their launchers, the sandbox entered in the child, the spawn
and the warm start (a zygote per interpreter and start-up environment forks python hooks). Knows neither plugins on
disk nor hook semantics.

    runtimes.py            runtime tags, launchers, commands
    runner.py              one hook call: spawn (or fork from the zygote), JSON in, reply out, stderr streamed
    sandbox.py             the SandboxSpec applied in the child (namespaces, rlimits, cgroup)
    warmstart.py           the zygotes and the spawner, kept warm
    warmstart_zygote.py    the zygote process itself (in exec mode: the loop of the spawner)
    hook_spawner.py        the cold-hook spawner: execs non-warm hooks so the worker never forks itself
"""
