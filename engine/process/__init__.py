"""One hook call in its own process: the runtimes and their launchers, the sandbox entered in the child, the spawn
and the warm start (a zygote per interpreter and start-up environment forks python hooks). Knows neither plugins on
disk nor hook semantics.

Its modules, one line each: docs/architecture.md, "Module map".
"""
