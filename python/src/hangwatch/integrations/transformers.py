"""Hugging Face `Trainer` integration: `Trainer(..., callbacks=[HangwatchCallback()])`."""

from __future__ import annotations

from typing import Any

from hangwatch import _client
from hangwatch.integrations._phases import CHECKPOINT, EVALUATION, OpenPhases

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(
        "hangwatch.integrations.transformers needs the `transformers` package (pip install transformers)"
    ) from exc


class HangwatchCallback(TrainerCallback):
    """Beats on every optimizer step (with `state.global_step`), gradient-accumulation micro-step and evaluation
    batch; wraps evaluation (and `trainer.predict`) in phase `evaluation` and checkpoint saving in phase `checkpoint`.

    The Trainer has no "evaluation/save is starting" event, but its own `DefaultFlowCallback` (always first in the
    list) sets `control.should_evaluate` / `control.should_save` in `on_step_end` / `on_epoch_end` right before the
    Trainer acts on them; this callback reads those flags to open the phase (so the eval dataloader's start is
    inside it), and `on_evaluate` / `on_save` close it. An evaluation without the flag (`trainer.evaluate()` by
    hand, `eval_on_start`, `trainer.predict()`) opens `evaluation` at its first `on_prediction_step`; `on_predict`
    closes it too.

    A phase is opened at most once and closed only when open. None outlives the pause it stands for: the next
    training step or epoch (`on_step_begin`, `on_epoch_begin`), `on_train_begin` and `on_train_end` close whatever
    is still open, e.g. when another callback cleared a flag after this one read it, or an evaluation raised and
    the caller went on.
    """

    def __init__(self) -> None:
        self._phases = OpenPhases()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end_all()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end_all()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end_all()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _client.beat(getattr(state, "global_step", None))
        self._before_log_save_evaluate(control)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _client.beat()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._before_log_save_evaluate(control)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.begin(EVALUATION)
        _client.beat()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(EVALUATION)
        if getattr(control, "should_save", False):
            self._phases.begin(CHECKPOINT)

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(EVALUATION)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end(CHECKPOINT)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._phases.end_all()

    def _before_log_save_evaluate(self, control: Any) -> None:
        if getattr(control, "should_evaluate", False):
            self._phases.begin(EVALUATION)
        elif getattr(control, "should_save", False):
            self._phases.begin(CHECKPOINT)
