"""One hook call in its own process: the runtimes and their launchers, the sandbox entered in the child, the spawn
and the warm start (a zygote per interpreter and start-up environment forks python hooks). Knows neither plugins on
disk nor hook semantics.

    runtimes.py            runtime tags, launchers, commands
    hook_call.py           HookCall (one call, as the runner takes it) and HookResult
    runner.py              one hook call: environment, sandbox spec, spawn (or fork from the zygote)
    hook_view.py           what a hook's view conceals and binds back (the policy's paths, docs/security.md)
    identity.py            the host uid/gid a plugin's hooks run as ([sandbox] in config.toml)
    hook_dirs.py           the hook's directories made ready for that identity, outside the sandbox
    data_disks.py          each plugin's data directory a filesystem of its own (a loop-mounted image), size-capped
    data_disk_images.py    its images, loop devices, the mount table and the tools (e2fsprogs, mount)
    data_disk_move.py      what a data directory held, moved into its image without following a link
    sandboxed_command.py   a plugin's non-hook command (install-deps' build) in the same sandbox
    hook_io.py             talking to the started hook: JSON in, reply out, stderr streamed, deadline kept
    sandbox.py             what a hook's sandbox is, probing, and the names its callers use from:
    sandbox_enter.py       the SandboxSpec and `enter`, applied in the child (namespaces, rlimits, capabilities)
    sandbox_spare.py       the same in two steps, for a zygote's spare child (`pre_enter`)
    sandbox_mounts.py      the hook's view of the filesystem (covered home, kept directories, read-only mounts)
    sandbox_tree.py        the keeper/init/hook processes of a sandboxed call
    sandbox_cgroups.py     per-call cgroups (memory and pids limits)
    sandbox_libc.py        the libc calls (unshare, mount, prctl, capset) and their constants
    sandbox_seccomp.py     the hooks' seccomp filter (libseccomp), and loading it
    pids.py                whether a pid still runs (the sandbox's cgroup cleanup, and the supervisor panel)
    warmstart.py           the zygotes and the spawner, kept warm
    zygote_client.py       the worker's handle on one zygote (start, hand it a call) and on the child it forked
    warmstart_zygote.py    the zygote process itself (in exec mode: the loop of the spawner), and a hook's `__main__`
    zygote_serve.py        the zygote's loop: spare children, hand-over of a call, answers
    zygote_child.py        a zygote's child, from its fork to the hook (sandbox entered, or exec in exec mode)
    zygote_wire.py         the hand-over of a call between the worker, a zygote and its spare (SCM_RIGHTS, JSON)
    hook_spawner.py        the cold-hook spawner: execs non-warm hooks so the worker never forks itself
"""
