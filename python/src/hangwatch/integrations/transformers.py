"""Hugging Face `Trainer` integration: `Trainer(..., callbacks=[HangwatchCallback()])`."""

from __future__ import annotations

from typing import Any

from hangwatch import _client
from hangwatch.integrations._phases import CHECKPOINT, EVAL, OpenPhases

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(
        "hangwatch.integrations.transformers needs the `transformers` package (pip install transformers)"
    ) from exc


class HangwatchCallback(TrainerCallback):
    """Beats on every optimizer step (with `state.global_step`), gradient-accumulation micro-step and evaluation
    batch; wraps evaluation in phase `eval` and checkpoint saving in phase `checkpoint`.

    The Trainer has no "evaluation/save is starting" event, but its own `DefaultFlowCallback` (always first in the
    list) sets `control.should_evaluate` / `control.should_save` in `on_step_end` / `on_epoch_end` right before the
    Trainer acts on them; this callback reads those flags to open the phase, and `on_evaluate` / `on_save` close it.
    An evaluation started by hand (`trainer.evaluate()`) opens `eval` at its first prediction step.
    """

    def __init__(self) -> None:
        self._phases = OpenPhases()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _client.beat(getattr(state, "global_step", None))
        self._before_log_save_evaluate(control)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _client.beat()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._before_log_save_evaluate(control)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.begin(EVAL)
        _client.beat()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(EVAL)
        if getattr(control, "should_save", False):
            self._phases.begin(CHECKPOINT)

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(EVAL)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(CHECKPOINT)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end_all()

    def _before_log_save_evaluate(self, control: Any) -> None:
        if getattr(control, "should_evaluate", False):
            self._phases.begin(EVAL)
        elif getattr(control, "should_save", False):
            self._phases.begin(CHECKPOINT)
