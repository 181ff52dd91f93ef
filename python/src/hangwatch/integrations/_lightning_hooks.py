"""Lightning hook logic shared by `lightning.pytorch` and `pytorch_lightning` callbacks; imports neither."""

from __future__ import annotations

from typing import Any

from hangwatch import _client, _rank
from hangwatch.integrations._phases import CHECKPOINT, EVALUATION, OpenPhases


class LightningHooks:
    """The hook logic, apart from the base class so that both Lightning packages can share it.

    Beats on every training batch (with `trainer.global_step`) and every validation, test and predict batch (no
    step). Phase `evaluation` spans each evaluation loop: validation (`on_validation_start` .. `on_validation_end`),
    the sanity check (from `on_sanity_check_start`, so the validation dataloader's start is inside it),
    `trainer.test` and `trainer.predict`. Phase `checkpoint` starts at `on_save_checkpoint`. Lightning has no hook
    after a checkpoint is written, so `checkpoint` ends at the next hook that means training or evaluation goes on
    (or at the end of fit); the phase therefore covers the write and the barrier that follows it on every rank.
    A phase is opened at most once and closed only when open; `on_exception` and `teardown` close what is left.
    """

    def __init__(self) -> None:
        self._phases = OpenPhases()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # Lightning knows the rank before torch.distributed is set up; the agent may know only the process tree.
        _rank.report(
            getattr(trainer, "global_rank", None),
            getattr(trainer, "local_rank", None),
            getattr(trainer, "world_size", None),
            "lightning",
        )

    def on_train_batch_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._phases.end(CHECKPOINT)

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self._phases.end(CHECKPOINT)
        _client.beat(getattr(trainer, "global_step", None))

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_evaluation()

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end(EVALUATION)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_evaluation()

    def on_validation_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        _client.beat()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end(EVALUATION)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_evaluation()

    def on_test_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        _client.beat()

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end(EVALUATION)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin_evaluation()

    def on_predict_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        _client.beat()

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end(EVALUATION)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._phases.begin(CHECKPOINT)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end(CHECKPOINT)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._phases.end_all()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._phases.end_all()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._phases.end_all()

    def _begin_evaluation(self) -> None:
        self._phases.end(CHECKPOINT)
        self._phases.begin(EVALUATION)
