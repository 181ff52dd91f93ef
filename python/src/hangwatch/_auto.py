"""Zero-code instrumentation: what hangwatch's bootstrap (`sitecustomize`) turns on in a rank that never imports
hangwatch.

The bootstrap's import watcher (python/bootstrap/sitecustomize.py, standard library only) calls `hook()` right after
the job imported one of `HOOKS`, before the job's code sees the module:

- `torch.optim.optimizer`: a beat on every optimizer step (the global optimizer step post hook, torch >= 2.0);
- `torch`: the `checkpoint` phase around `torch.save`;
- `torch.distributed.checkpoint`: the `checkpoint` phase around `save`, `save_state_dict` and `async_save`;
- `transformers.trainer`: every `Trainer` gets hangwatch's callback (steps, evaluation and checkpoint phases) unless
  the job gave it one;
- `lightning.pytorch.trainer.trainer` and `pytorch_lightning.trainer.trainer`: the same for Lightning's `Trainer`;
- `accelerate.accelerator`: the `checkpoint` phase around `Accelerator.save_state`.

A job that beats itself (`hangwatch.beat()`, a callback) is not counted twice: the optimizer-step beats stop for good
the first time another beat is seen between two steps. Nothing here raises into the job: a hook that fails is
skipped and counted in `stats()["auto"]`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List

from hangwatch import _client
from hangwatch._phase import CHECKPOINT, phase

_state: Dict[str, Any] = {"hooked": [], "failed": [], "step_beats": 0, "step_beats_stopped": False}
_step_handle: Any = None
_beats_after_mine = -1
"""The client's beat count right after this module's last step beat (-1: none sent yet)."""


def stats() -> Dict[str, Any]:
    """What was hooked, what failed, how many step beats were sent and whether they stopped (the job beats)."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in _state.items()}


def _step_beat(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The optimizer step post hook: one beat, unless someone else beat since the last one (then never again)."""
    global _beats_after_mine, _step_handle
    count = _client.beat_count()
    if _beats_after_mine >= 0 and count != _beats_after_mine:
        handle, _step_handle = _step_handle, None
        _state["step_beats_stopped"] = True
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass
        return
    _client.beat()
    _state["step_beats"] += 1
    _beats_after_mine = _client.beat_count()


def _in_checkpoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` inside the `checkpoint` phase (once: a function already wrapped is returned as it is)."""
    if getattr(fn, "__hangwatch_checkpoint__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with phase(CHECKPOINT):
            return fn(*args, **kwargs)

    wrapper.__hangwatch_checkpoint__ = True  # type: ignore[attr-defined]
    return wrapper


def _hook_optimizer(optimizer: Any) -> None:
    global _step_handle
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is not None and _step_handle is None:
        _step_handle = register(_step_beat)


def _hook_torch(torch: Any) -> None:
    serialization = getattr(torch, "serialization", None)
    save = getattr(serialization, "save", None)
    if callable(save):
        wrapped = _in_checkpoint(save)
        serialization.save = wrapped
        # `torch.save` is the same function: one wrapper for both names.
        if getattr(torch, "save", None) is save:
            torch.save = wrapped


def _hook_dcp(dcp: Any) -> None:
    for name in ("save", "save_state_dict", "async_save"):
        fn = getattr(dcp, name, None)
        if callable(fn):
            setattr(dcp, name, _in_checkpoint(fn))


def _with_callback(cls: Any, make: Callable[[], Any]) -> None:
    """Wraps `cls.__init__` (keyword-only `callbacks=`, Lightning) so that the trainer gets hangwatch's callback when
    it has none of that type."""
    init = cls.__init__
    if getattr(init, "__hangwatch_callback__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            given = kwargs.get("callbacks")
            listed: List[Any] = [] if given is None else (list(given) if isinstance(given, (list, tuple)) else [given])
            if not any(isinstance(c, make) or c is make for c in listed):
                kwargs["callbacks"] = listed + [make()]
        except Exception as exc:
            _failed("callback", exc)
        init(self, *args, **kwargs)

    __init__.__hangwatch_callback__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _hook_transformers(module: Any) -> None:
    from hangwatch.integrations.transformers import HangwatchCallback

    cls = module.Trainer
    init = cls.__init__
    if getattr(init, "__hangwatch_callback__", False):
        return

    # The HF Trainer takes `callbacks` positionally too: the callback is added after its own __init__.
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            present = self.callback_handler.callbacks
            if not any(isinstance(c, HangwatchCallback) for c in present):
                self.add_callback(HangwatchCallback())
        except Exception as exc:
            _failed("callback", exc)

    __init__.__hangwatch_callback__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _hook_lightning(module: Any) -> None:
    from hangwatch.integrations.lightning import HangwatchCallback

    _with_callback(module.Trainer, HangwatchCallback)


def _hook_pytorch_lightning(module: Any) -> None:
    from hangwatch.integrations.pytorch_lightning import HangwatchCallback

    _with_callback(module.Trainer, HangwatchCallback)


def _hook_accelerate(module: Any) -> None:
    cls = module.Accelerator
    cls.save_state = _in_checkpoint(cls.save_state)


HOOKS: Dict[str, Callable[[Any], None]] = {
    "torch": _hook_torch,
    "torch.optim.optimizer": _hook_optimizer,
    "torch.distributed.checkpoint": _hook_dcp,
    "transformers.trainer": _hook_transformers,
    "lightning.pytorch.trainer.trainer": _hook_lightning,
    "pytorch_lightning.trainer.trainer": _hook_pytorch_lightning,
    "accelerate.accelerator": _hook_accelerate,
}


def _failed(name: str, exc: BaseException) -> None:
    _state["failed"].append("%s: %s" % (name, exc))


def hook(name: str, module: Any) -> None:
    """Hooks `module` (just loaded under `name`, one of `HOOKS`); never raises."""
    hook_of = HOOKS.get(name)
    if hook_of is None or name in _state["hooked"]:
        return
    try:
        hook_of(module)
        _state["hooked"].append(name)
    except Exception as exc:
        _failed(name, exc)
