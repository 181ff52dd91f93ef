"""Lightning integration for code that imports `pytorch_lightning` while the `lightning` package is also installed."""

from __future__ import annotations

from hangwatch.integrations._lightning_hooks import LightningHooks

try:
    from pytorch_lightning import Callback
except ImportError as exc:
    raise ImportError(
        "hangwatch.integrations.pytorch_lightning needs `pytorch_lightning` (pip install pytorch-lightning)"
    ) from exc


class HangwatchCallback(LightningHooks, Callback):
    """A `pytorch_lightning.Callback` with the hooks of `hangwatch.integrations.lightning`."""

    def __init__(self) -> None:
        Callback.__init__(self)
        LightningHooks.__init__(self)
