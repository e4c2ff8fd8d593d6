"""The bounded tail of a sandboxed command's output (stdout and stderr together).

Only the last 16 KiB are kept, in memory, whatever the command prints; that tail
is what the run's `result.output` holds. The values of the target's secret-like
environment variables (see `secret_values`) are masked in it, also across the
cut, and the executor never writes output or environment to its own logs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

TAIL_BYTES = 16 * 1024
MASK = b"***"
MIN_SECRET_CHARS = 4
MAX_SECRET_BYTES = 4096  # longer values are masked too, but only their last 4 KiB matter
_SECRET_NAME = re.compile(
    r"(SECRET|TOKEN|PASSW|PWD|KEY|CREDENTIAL|AUTH|PRIVATE|SESSION|COOKIE|SIGNATURE|DSN|_URL$)",
    re.IGNORECASE,
)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values to mask: those of variables whose name looks like a secret
    (API_TOKEN, DB_PASSWORD, AWS_SECRET_ACCESS_KEY, DATABASE_URL, ...)."""
    return [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS]


class Tail:
    """Keeps the last `limit` bytes fed to it (plus a margin so a secret cut by
    the boundary is still recognised and masked whole)."""

    def __init__(self, limit: int = TAIL_BYTES, secrets: Iterable[str] = ()):
        self.limit = limit
        self.secrets = sorted(
            {s.encode() for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True
        )
        self._keep = limit + min(max((len(s) for s in self.secrets), default=0), MAX_SECRET_BYTES)
        self._buf = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._buf += chunk
        if len(self._buf) > 2 * self._keep:  # trim in batches, not on every chunk
            del self._buf[: len(self._buf) - self._keep]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        data = bytes(self._buf[-self._keep :])
        cut = self.total > len(data)
        if cut:
            data = self._mask_cut_secret(data)
        for s in self.secrets:
            data = data.replace(s, MASK)
        if len(data) > self.limit:
            data, cut = data[-self.limit :], True
        if cut:  # do not start inside a UTF-8 character: skip continuation bytes
            start = 0
            while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
                start += 1
            data = data[start:]
        return data.decode("utf-8", errors="replace")

    def _mask_cut_secret(self, data: bytes) -> bytes:
        """The kept bytes may begin with the end of a secret whose start was
        dropped; mask that end too."""
        for s in self.secrets:
            for k in range(len(s) - 1, 2, -1):  # a 1-2 byte fragment reveals nothing
                if data.startswith(s[-k:]):
                    return MASK + data[k:]
        return data
