"""The hand-over of a call, as the worker (engine/process/zygote_client.py) and a zygote or the spawner
(engine/process/zygote_serve.py, zygote_child.py) both speak it, and as a zygote speaks it to its spare child.

A call is one message whose data is the spec's length (`HEADER`) and whose ancillary data carries its descriptors
(SCM_RIGHTS: the reply socket, the hook's stdin, stdout and stderr, then in exec mode the exec error pipe); the JSON
spec follows on the reply socket (to a spare: on the same socket). A length of 0 without descriptors retires a
zygote. Answers on the reply socket are JSON lines: `{"pid"}` (or `{"error"}`), then `{"rc", "oom"}`.
Stdlib only: loaded outside the engine package in the zygote and the spawner, like engine/process/sandbox.py.
"""

import array
import json
import socket
import struct

HEADER = struct.Struct("!I")
MAX_FDS = 8  # room in a received message (a call passes 4 or 5; one with another count is refused)


def send_call(sock, length, fds):
    """The call's header and its descriptors, in one message (the spec itself follows, `length` bytes)."""
    sock.sendmsg([HEADER.pack(length)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def recv_call(sock):
    """(header bytes, descriptors) of one message; empty bytes when the other end is gone."""
    msg, anc, _flags, _addr = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(MAX_FDS * 4))
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, fds


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("reply socket closed before the spec arrived")
        buf += chunk
    return bytes(buf)


def send_line(sock, obj):
    """One JSON answer line; a worker that gave up on the call is not an error (the child is reaped anyway)."""
    try:
        sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass
