"""Which calls librefang-client sends again: against a peer that reads each request and drops the connection
without answering (a service dying mid-call), a safe call is retried, a memory `add` is sent once (a second POST
would make a second memory); a peer that never answers ends the call at its deadline; `Retry-After` is read as seconds or as an HTTP date."""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import httpx
import pytest
from librefang_client import ConnectionFailed, DeadlineExceeded, LibreFang, RetryPolicy
from librefang_client._core import retry_after


class DroppingPeer:
    """Accepts connections, reads a request's first bytes and closes (or, `silent`, keeps it open without a word):
    counts the requests it saw."""

    def __init__(self, silent: bool = False):
        self.silent = silent
        self.held: list[socket.socket] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if conn.recv(65536):
                self.requests += 1
            if self.silent:
                self.held.append(conn)
            else:
                conn.close()


@pytest.fixture
def peer():
    p = DroppingPeer()
    yield p
    p.sock.close()


def client(url: str) -> LibreFang:
    return LibreFang(url, "t", retry=RetryPolicy(max_retries=3, backoff=0.01))


def test_it_retries_a_safe_call_the_service_dropped(peer):
    with pytest.raises(ConnectionFailed):
        client(peer.url).memories.get(1)
    assert peer.requests == 4


def test_it_retries_after_turn_the_service_dropped(peer):
    with pytest.raises(ConnectionFailed):
        client(peer.url).after_turn("a", [{"role": "user", "content": "hi"}])
    assert peer.requests == 4


def test_it_sends_a_new_memory_only_once_when_the_service_dropped_it(peer):
    with pytest.raises(ConnectionFailed):
        client(peer.url).memories.add("a", "remember me")
    assert peer.requests == 1


def test_it_ends_a_call_at_its_deadline_when_the_service_never_answers():
    peer = DroppingPeer(silent=True)
    try:
        with pytest.raises(DeadlineExceeded) as late:
            client(peer.url).ingest("a", "hello", deadline=0.5)
        assert late.value.code == "deadline_exceeded" and peer.requests >= 1
    finally:
        peer.sock.close()


def test_it_reads_retry_after_as_seconds_or_an_http_date():
    assert retry_after(httpx.Response(503, headers={"Retry-After": "2"})) == 2
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after(httpx.Response(503, headers={"Retry-After": when})) <= 30
    assert retry_after(httpx.Response(503)) is None
    assert retry_after(httpx.Response(503, headers={"Retry-After": "soon"})) is None
