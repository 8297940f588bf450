"""A typed Python client for the LibreFang context-engine service: the hooks (ingest, assemble, compact,
after_turn, ...) and the memory API, sync (`LibreFang`) and async (`AsyncLibreFang`), with retries that honour
`Retry-After` and errors that carry the service's `code`, `message` and `details`. docs/agents.md has a quickstart.
"""

from librefang_client._core import RetryPolicy
from librefang_client.client import AsyncLibreFang, LibreFang, Memories
from librefang_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    DeadlineExceeded,
    Forbidden,
    LibreFangError,
    NotFound,
    Unauthorized,
    Unavailable,
)

__all__ = ["AsyncLibreFang", "BadRequest", "Conflict", "ConnectionFailed", "DeadlineExceeded", "Forbidden",
           "LibreFang", "LibreFangError", "Memories", "NotFound", "RetryPolicy", "Unauthorized", "Unavailable"]
__version__ = "0.1.0"
