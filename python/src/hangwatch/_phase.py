"""`hangwatch.phase`: tells the agent which part of the job runs, so each part gets its own stall threshold."""

from __future__ import annotations

import contextlib
from typing import Any

from hangwatch import _client

CHECKPOINT = "checkpoint"
"""The one name of the checkpoint phase, used by the framework callbacks and the zero-code hooks (`_auto`)."""

EVALUATION = "evaluation"
"""The one name of the evaluation phase, used by `evaluation()` and every framework callback, so the agent learns
one evaluation duration per job whatever sends it."""


class phase(contextlib.ContextDecorator):
    """`with hangwatch.phase("checkpoint"):` or `@hangwatch.phase("checkpoint")`.

    A 10-minute checkpoint must not look like a hang and a 10-second stall in a training step must; the agent can
    only tell the two apart when it knows the phase. Phases nest (each `with` sends its own begin and end). Begin and
    end travel in order with log records (queued when the agent is slow, never blocking); the user's exception, if
    any, goes on unchanged.
    """

    def __init__(self, name: Any) -> None:
        try:
            text = str(name).replace("\r", " ").replace("\n", " ")
        except Exception:
            text = "?"
        self.name = text
        encoded = text.encode("utf-8", "replace")
        self._begin = b"begin " + encoded
        self._end = b"end " + encoded

    def __enter__(self) -> "phase":
        _client.post(b"phase", self._begin, "phase")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        _client.post(b"phase", self._end, "phase")
        return False

    def __repr__(self) -> str:
        return "hangwatch.phase(%r)" % self.name


def evaluation() -> phase:
    """`with hangwatch.evaluation():` or `@hangwatch.evaluation()`: the phase `evaluation`, as the callbacks send it.

    A validation loop that runs for minutes without a beat is not a hang: inside this phase the agent applies the
    evaluation threshold it learned from earlier evaluations (the ceiling for the first one) instead of the step
    threshold. Same as `hangwatch.phase("evaluation")`.
    """
    return phase(EVALUATION)
