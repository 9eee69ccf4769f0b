"""Exceptions raised by boltccl.

Argument errors raise the builtin ``ValueError`` or ``TypeError`` (the group stays usable).
Everything else raises :class:`Error` or a subclass; after such an error the group is
unusable (every later call fails): ``Group.shrink()`` makes a group of the ranks still there,
or finish or restart the job.
"""

from __future__ import annotations

import builtins
from typing import Optional

__all__ = ["Error", "TimeoutError", "PeerLostError", "ConfigError"]


class Error(Exception):
    """A boltccl failure. ``kind`` is a stable name ("timeout", "peer_lost", "mismatch",
    "protocol", "io", "busy", "interrupted", ...) and ``rank`` the rank it blames, if any."""

    kind: str = "internal"
    rank: Optional[int] = None


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - deliberately shadows the builtin
    """No progress within the deadline (``BOLTCCL_TIMEOUT_MS`` or ``init(timeout=...)``), or
    the group did not form within ``BOLTCCL_INIT_TIMEOUT_MS``. Also a builtin ``TimeoutError``."""


class PeerLostError(Error, builtins.ConnectionError):
    """A peer process died or aborted the group. Also a builtin ``ConnectionError``."""


class ConfigError(Error):
    """The configuration (environment or ``init()`` arguments) is wrong or incomplete."""
