"""accelerate integration: `accelerator = watch(Accelerator(...))`."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from hangwatch import _client
from hangwatch._phase import phase

T = TypeVar("T")

_MARK = "_hangwatch_watched"
_PHASED = {"save_state": "checkpoint", "save_model": "checkpoint", "save": "checkpoint", "load_state": "load"}


def watch(accelerator: T) -> T:
    """Make `accelerator` report progress; returns it, so adoption is one line.

    accelerate has no callbacks, so this wraps methods of this one instance (not the class): `backward` beats after
    every backward pass with the number of backward passes so far in this process as the step (micro-batches
    under gradient accumulation; equal on every data-parallel rank, so a rank that is behind shows), `save_state`,
    `save_model` and `save` run in phase `checkpoint`, `load_state` in phase `load`. Calling it twice is harmless.
    It does not import accelerate.

    accelerate has no evaluation hook either, and nothing `watch` could wrap marks where an evaluation loop starts
    and ends (`gather_for_metrics` runs per batch, and only when there are metrics), so an evaluation loop says it
    itself with `with hangwatch.evaluation():` (a `hangwatch.beat()` per batch inside makes progress within it
    count).
    """
    if getattr(accelerator, _MARK, False):
        return accelerator
    backward = getattr(accelerator, "backward", None)
    if callable(backward):
        accelerator.backward = _beating(backward)  # type: ignore[attr-defined]
    for method, name in _PHASED.items():
        original = getattr(accelerator, method, None)
        if callable(original):
            setattr(accelerator, method, phase(name)(original))
    setattr(accelerator, _MARK, True)
    return accelerator


def _beating(backward: Callable[..., Any]) -> Callable[..., Any]:
    count = [0]

    @functools.wraps(backward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = backward(*args, **kwargs)
        count[0] += 1
        _client.beat(count[0])
        return result

    return wrapper
