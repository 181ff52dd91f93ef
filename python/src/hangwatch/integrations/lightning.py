"""Lightning integration: `Trainer(callbacks=[HangwatchCallback()])` with `lightning.pytorch` or `pytorch_lightning`."""

from __future__ import annotations

from hangwatch.integrations._lightning_hooks import LightningHooks

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError(
            "hangwatch.integrations.lightning needs `lightning` or `pytorch_lightning` (pip install lightning)"
        ) from exc


class HangwatchCallback(LightningHooks, Callback):
    """Add to `Trainer(callbacks=[...])`; see `LightningHooks` for what it sends."""

    def __init__(self) -> None:
        Callback.__init__(self)
        LightningHooks.__init__(self)
