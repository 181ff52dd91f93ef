"""`hangwatch.LoggingHandler`: log records go to the agent, which writes them; the training process never waits."""

from __future__ import annotations

import logging
import sys
from typing import Optional, Union

from hangwatch import _client

DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LoggingHandler(logging.Handler):
    """Ship each formatted record to the agent as a `log` message.

    Why: a rank that writes its log to a shared filesystem stops dead in `write()` when that filesystem freezes; the
    agent writes the log instead, from threads it can abandon. Records are sent directly while the agent keeps up;
    when a send would block they wait in the client's ordered queue (at most `QUEUE_MAX_MESSAGES` records and
    `QUEUE_MAX_BYTES` bytes, shared with phase messages) that a daemon thread drains, so order is kept and nothing
    blocks. Past those bounds new records are dropped and counted (`hangwatch.stats()["dropped_by_type"]["log"]`)
    with one warning on stderr.

    Without `HANGWATCH_SOCKET` (no agent runs this job) records go to `fallback`: by default stderr, formatted by
    this handler; any `logging.Handler` (e.g. the FileHandler the job used before); or `None` to discard them.
    """

    def __init__(
        self,
        level: int = logging.NOTSET,
        *,
        fallback: Union[logging.Handler, str, None] = "stderr",
        flush_timeout: float = 2.0,
    ) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter(DEFAULT_FORMAT))
        self.fallback = fallback
        self.flush_timeout = flush_timeout

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not _client.enabled():
                self._emit_fallback(record)
                return
            text = self.format(record)
            _client.post(b"log", b"%d\n" % record.levelno + text.encode("utf-8", "replace"), "log")
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        """Wait at most `flush_timeout` seconds for queued records (called by `logging.shutdown` at exit)."""
        try:
            if _client.enabled():
                _client.flush(self.flush_timeout)
            elif isinstance(self.fallback, logging.Handler):
                self.fallback.flush()
        except Exception:
            pass

    def _emit_fallback(self, record: logging.LogRecord) -> None:
        fallback = self.fallback
        if fallback is None:
            return
        if isinstance(fallback, logging.Handler):
            fallback.handle(record)
            return
        stream: Optional[object] = sys.stderr
        if stream is not None:
            sys.stderr.write(self.format(record) + "\n")
