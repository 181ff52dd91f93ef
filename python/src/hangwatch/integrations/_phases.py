"""Open-phase bookkeeping shared by the callbacks: frameworks report ends without begins and begins twice."""

from __future__ import annotations

from typing import List

from hangwatch import _client
from hangwatch._phase import CHECKPOINT, EVALUATION

__all__ = ["CHECKPOINT", "EVALUATION", "OpenPhases"]


class OpenPhases:
    """Sends a phase begin only when the phase is not open and an end only when it is, in the order opened."""

    def __init__(self) -> None:
        self._open: List[str] = []

    def begin(self, name: str) -> None:
        if name in self._open:
            return
        self._open.append(name)
        _client.post(b"phase", b"begin " + name.encode(), "phase")

    def end(self, name: str) -> None:
        if name not in self._open:
            return
        self._open.remove(name)
        _client.post(b"phase", b"end " + name.encode(), "phase")

    def end_all(self) -> None:
        if not self._open:
            return
        for name in reversed(list(self._open)):
            self.end(name)

    def is_open(self, name: str) -> bool:
        return name in self._open
