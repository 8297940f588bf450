"""The hook's seccomp filter: the system calls no hook needs, refused. Compiled once per process by libseccomp
(`libseccomp.so.2`, through ctypes: the kernel's BPF for this machine's architecture, other architectures' calls
killed), loaded by the hook's own process last, after its uid drop and no_new_privs (`load`, here for python
children; engine/process/native/spare.c loads the same bytes, handed over by the spawner). Stdlib only, like
engine/process/sandbox.py. What is refused, and why, is `REFUSED` below and docs/security.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading

# Refused with EPERM: debugging other processes, (un)mounting and namespaces, kernel modules and kexec, BPF, perf,
# userfaultfd, the key store, swap, reboot, the clock and the host name, raw I/O ports, io_uring, handles that
# bypass path checks, and the like. A call this kernel does not know is skipped.
REFUSED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount", "umount2", "pivot_root", "chroot", "setns", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init", "lookup_dcookie",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
    "get_kernel_syms", "query_module",
    "keyctl", "add_key", "request_key",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "nfsservctl", "uselib",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)
CLONE_NEWUSER = 0x10000000
# clone and unshare asking for a new user namespace are refused (the one way left to gain capabilities); clone3
# passes its flags in memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
NEW_USER_NAMESPACE = ("clone", "unshare")

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_MASKED_EQ = 7
# SCMP_FLTATR_CTL_OPTIMIZE set to 2 (libseccomp >= 2.5): the syscall numbers as a binary tree instead of one
# comparison after another. Same decisions, and a shorter load: the kernel runs the filter once per syscall number to
# find the ones it always allows (seccomp's action cache), with the filter's lock held.
_SCMP_FLTATR_CTL_OPTIMIZE = 8
_BINARY_TREE = 2
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_lock = threading.Lock()
_compiled: list = []  # [(bytes or None, why not)]


def compiled() -> tuple:
    """(the filter as BPF bytes, None) or (None, why there is none). Compiled once per process; a helper calls it
    before it forks, so that its children share the result."""
    if not _compiled:
        with _lock:
            if not _compiled:
                try:
                    _compiled.append((_compile(), None))
                except OSError as exc:
                    _compiled.append((None, str(exc)))
    return _compiled[0]


def _library():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise OSError(f"libseccomp is not installed ({exc}): install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def _compile() -> bytes:
    lib = _library()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_OPTIMIZE, _BINARY_TREE)  # (an older libseccomp: linear, as valid)
        def rule(name: str, action: int, *compare: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not a system call of this architecture
            args = (_ArgCmp * len(compare))(*compare) if compare else None
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(compare), args)
            if rc < 0:
                raise OSError(f"seccomp rule for {name}: {os.strerror(-rc)}")

        for name in REFUSED:
            rule(name, _errno_action(errno.EPERM))
        for name in NEW_USER_NAMESPACE:
            rule(name, _errno_action(errno.EPERM), _ArgCmp(0, _SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        rule("clone3", _errno_action(errno.ENOSYS))
        read_end, write_end = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, write_end)
            os.close(write_end)
            write_end = -1
            if rc < 0:
                raise OSError(f"seccomp_export_bpf: {os.strerror(-rc)}")
            chunks = []
            while True:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
    finally:
        lib.seccomp_release(ctx)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise OSError("libseccomp exported no filter")
    return program


class Prepared:
    """A filter as prctl takes it (a sock_fprog over a copy of its bytes), built before it is needed: a prepared
    hook builds it ahead of its call, so that loading it on the call's path is one system call."""

    __slots__ = ("_buffer", "_fprog", "pointer")

    def __init__(self, program: bytes):
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))
        self.pointer = ctypes.c_void_p(ctypes.addressof(self._fprog))


def load(lib, program: bytes | Prepared) -> int:
    """Install `program` (BPF bytes from `compiled`, or `Prepared` from them) on this thread; 0, or -1 with errno.
    Needs no_new_privs (or CAP_SYS_ADMIN) first."""
    prepared = program if isinstance(program, Prepared) else Prepared(program)
    return lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prepared.pointer, 0, 0)
