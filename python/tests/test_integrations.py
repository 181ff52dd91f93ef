"""Framework callbacks: what the agent receives for a training run's sequence of framework events.

Real packages are used when installed (transformers installs without torch and is exercised through its own
CallbackHandler and DefaultFlowCallback); otherwise, and always for lightning and accelerate (which need torch),
the callbacks run against stand-in base classes and the event order the frameworks use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from types import SimpleNamespace

import pytest

from hangwatch import _client

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_LIGHTNING = any(importlib.util.find_spec(name) for name in ("lightning", "pytorch_lightning"))


@pytest.fixture
def isolated_modules():
    """Undo every module import and stand-in the test makes, so stand-ins never leak into other tests."""
    before = dict(sys.modules)
    yield
    for name in list(sys.modules):
        if name not in before:
            del sys.modules[name]
    sys.modules.update(before)


class StandInBase:
    """A framework base class: every hook the subclass does not define is a no-op, as in the real ones."""

    def __getattr__(self, name):
        if name.startswith("on_") or name == "teardown":
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def stand_in(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class Recorder:
    """What the callbacks hand to the client, in call order, as (type, fields) of the messages it would send.

    Recorded at the client's boundary rather than at a socket: an agent thread in this process cannot be relied on to
    read before the ~10-datagram socket queue fills, and lost beats would make these tests about scheduling.
    The socket path itself is covered by test_protocol.py.
    """

    def __init__(self, monkeypatch):
        self.seen = []
        monkeypatch.setattr(_client, "beat", self.beat)
        monkeypatch.setattr(_client, "post", self.post)

    def beat(self, step=None):
        self.seen.append(("beat", ["-" if step is None else str(step)]))

    def post(self, mtype, rest, kind):
        self.seen.append((mtype.decode(), rest.decode().split(" ", 1)))


@pytest.fixture
def recorder(monkeypatch):
    return Recorder(monkeypatch)


def events(recorder):
    return recorder.seen


def beat(step="-"):
    return ("beat", [str(step)])


def begin(name):
    return ("phase", ["begin", name])


def end(name):
    return ("phase", ["end", name])


def fresh_import(name):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


# --- transformers -------------------------------------------------------------------------------------------------

TRANSFORMERS_EXPECTED = (
    [beat(1)]
    + [beat(2), begin("evaluation"), beat(), beat(), end("evaluation")]
    + [beat(3), begin("checkpoint"), end("checkpoint")]
    + [beat(4), begin("evaluation"), beat(), beat(), end("evaluation")]
    + [beat(5)]
    + [beat(6), begin("evaluation"), beat(), beat(), end("evaluation"), begin("checkpoint"), end("checkpoint")]
)
"""eval every 2 steps, save every 3, two evaluation batches: what a Trainer run of 6 steps sends."""


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_transformers_callback_with_the_real_trainer_flow(one_process, recorder, tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    from hangwatch.integrations.transformers import HangwatchCallback

    args = TrainingArguments(
        output_dir=str(tmp_path),
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=3,
        logging_steps=100,
        report_to=[],
    )
    handler = CallbackHandler([DefaultFlowCallback, HangwatchCallback()], None, None, None, None)
    state = TrainerState(max_steps=100)
    for field in ("logging_steps", "eval_steps", "save_steps"):
        setattr(state, field, getattr(args, field))
    control = TrainerControl()
    for step in range(1, 7):
        control = handler.on_step_begin(args, state, control)
        state.global_step = step
        control = handler.on_step_end(args, state, control)
        if control.should_evaluate:
            for _ in range(2):
                control = handler.on_prediction_step(args, state, control)
            control = handler.on_evaluate(args, state, control, metrics={})
        if control.should_save:
            control = handler.on_save(args, state, control)
    assert events(recorder) == TRANSFORMERS_EXPECTED


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_transformers_evaluation_phase_over_the_socket(one_process, agent, tmp_path):
    """transformers' own CallbackHandler and DefaultFlowCallback drive the callback through a run with an evaluation
    at the start, every 2 steps (3 batches each) and a `trainer.predict` at the end; the agent's socket gets each
    evaluation as one `begin evaluation` .. `end evaluation` with a beat per batch inside, every datagram in order."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    import hangwatch
    from hangwatch.integrations.transformers import HangwatchCallback

    args = TrainingArguments(
        output_dir=str(tmp_path),
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=3,
        logging_steps=100,
        report_to=[],
    )
    handler = CallbackHandler([DefaultFlowCallback, HangwatchCallback()], None, None, None, None)
    state = TrainerState(max_steps=6)
    for field in ("logging_steps", "eval_steps", "save_steps"):
        setattr(state, field, getattr(args, field))
    control = TrainerControl()
    got = []

    def event(name, **kwargs):
        nonlocal control
        control = getattr(handler, name)(args, state, control, **kwargs)
        got.extend(agent.take())

    def evaluation(batches, end="on_evaluate"):
        for _ in range(batches):
            event("on_prediction_step")
        event(end, metrics={})

    event("on_train_begin")
    evaluation(2)  # eval_on_start: no flag, opened by the first prediction step
    event("on_epoch_begin")
    for step in range(1, 7):
        event("on_step_begin")
        state.global_step = step
        event("on_step_end")
        if control.should_evaluate:
            evaluation(3)
        if control.should_save:
            event("on_save")
    event("on_epoch_end")
    event("on_train_end")
    evaluation(2, end="on_predict")

    evaluation_run = lambda n: [begin("evaluation")] + [beat()] * n + [end("evaluation")]  # noqa: E731
    assert [(m.type, m.fields) for m in got] == (
        [("hello", ["-", hangwatch.__version__])]
        + evaluation_run(2)
        + [beat(1), beat(2)]
        + evaluation_run(3)
        + [beat(3), begin("checkpoint"), end("checkpoint"), beat(4)]
        + evaluation_run(3)
        + [beat(5), beat(6)]
        + evaluation_run(3)
        + [begin("checkpoint"), end("checkpoint")]
        + evaluation_run(2)
    )
    assert [m.seq for m in got] == list(range(1, len(got) + 1))
    assert {(m.rank, m.pid) for m in got} == {("-", os.getpid())}
    phases = [" ".join(m.fields) for m in got if m.type == "phase" and m.fields[1] == "evaluation"]
    assert phases == ["begin evaluation", "end evaluation"] * 5
    stats = hangwatch.stats()
    assert (stats["dropped"], stats["queued"]) == (0, 0)


def test_transformers_callback_with_stand_in_flags(recorder, isolated_modules):
    stand_in("transformers", TrainerCallback=type("TrainerCallback", (), {}))
    cb = fresh_import("hangwatch.integrations.transformers").HangwatchCallback()
    for step in range(1, 7):
        state = SimpleNamespace(global_step=step)
        control = SimpleNamespace(should_evaluate=step % 2 == 0, should_save=step % 3 == 0)
        cb.on_step_end(None, state, control)
        if control.should_evaluate:
            cb.on_prediction_step(None, state, control)
            cb.on_prediction_step(None, state, control)
            control.should_evaluate = False
            cb.on_evaluate(None, state, control, metrics={})
        if control.should_save:
            control.should_save = False
            cb.on_save(None, state, control)
    assert events(recorder) == TRANSFORMERS_EXPECTED


def test_transformers_evaluate_called_by_hand_and_epoch_flags(recorder, isolated_modules):
    stand_in("transformers", TrainerCallback=type("TrainerCallback", (), {}))
    cb = fresh_import("hangwatch.integrations.transformers").HangwatchCallback()
    idle = SimpleNamespace(should_evaluate=False, should_save=False)
    cb.on_prediction_step(None, None, idle)
    cb.on_evaluate(None, None, idle)
    cb.on_substep_end(None, None, idle)
    cb.on_epoch_end(None, None, SimpleNamespace(should_evaluate=False, should_save=True))
    cb.on_save(None, None, idle)
    cb.on_save(None, None, idle)
    assert events(recorder) == (
        [begin("evaluation"), beat(), end("evaluation")] + [beat(), begin("checkpoint"), end("checkpoint")]
    )


def test_transformers_evaluation_is_opened_once_closed_once_and_never_left_open(recorder, isolated_modules):
    stand_in("transformers", TrainerCallback=type("TrainerCallback", (), {}))
    cb = fresh_import("hangwatch.integrations.transformers").HangwatchCallback()
    idle = SimpleNamespace(should_evaluate=False, should_save=False)
    # Ends without a begin send nothing.
    cb.on_evaluate(None, None, idle)
    cb.on_predict(None, None, idle)
    # The flag opens it; prediction steps do not open it again; a second on_evaluate does not close it again.
    cb.on_step_end(None, SimpleNamespace(global_step=1), SimpleNamespace(should_evaluate=True, should_save=False))
    cb.on_prediction_step(None, None, idle)
    cb.on_prediction_step(None, None, idle)
    cb.on_evaluate(None, None, idle)
    cb.on_evaluate(None, None, idle)
    # The flag was set but another callback cleared it: no on_evaluate; the next step closes the phase.
    cb.on_step_end(None, SimpleNamespace(global_step=2), SimpleNamespace(should_evaluate=True, should_save=False))
    cb.on_step_begin(None, None, idle)
    cb.on_step_end(None, SimpleNamespace(global_step=3), idle)
    # An evaluation that raised (no on_evaluate) is closed by the next epoch, and one open at train end by it.
    cb.on_prediction_step(None, None, idle)
    cb.on_epoch_begin(None, None, idle)
    cb.on_prediction_step(None, None, idle)
    cb.on_train_end(None, None, idle)
    cb.on_train_end(None, None, idle)
    # trainer.predict: opened by its first prediction step, closed by on_predict.
    cb.on_prediction_step(None, None, idle)
    cb.on_predict(None, None, idle)
    assert events(recorder) == (
        [beat(1), begin("evaluation"), beat(), beat(), end("evaluation")]
        + [beat(2), begin("evaluation"), end("evaluation"), beat(3)]
        + [begin("evaluation"), beat(), end("evaluation")]
        + [begin("evaluation"), beat(), end("evaluation")]
        + [begin("evaluation"), beat(), end("evaluation")]
    )


def test_transformers_open_checkpoint_is_closed_when_training_goes_on(recorder, isolated_modules):
    """`save_strategy="best"` clears `should_save` after on_evaluate saw it set: no save, no on_save."""
    stand_in("transformers", TrainerCallback=type("TrainerCallback", (), {}))
    cb = fresh_import("hangwatch.integrations.transformers").HangwatchCallback()
    both = SimpleNamespace(should_evaluate=True, should_save=True)
    cb.on_step_end(None, SimpleNamespace(global_step=1), both)
    cb.on_prediction_step(None, None, both)
    cb.on_evaluate(None, None, both)
    cb.on_step_begin(None, None, SimpleNamespace(should_evaluate=False, should_save=False))
    assert events(recorder) == [
        beat(1),
        begin("evaluation"),
        beat(),
        end("evaluation"),
        begin("checkpoint"),
        end("checkpoint"),
    ]


@pytest.mark.skipif(HAS_TRANSFORMERS, reason="transformers is installed")
def test_transformers_missing_says_what_to_install(isolated_modules):
    with pytest.raises(ImportError, match="pip install transformers"):
        fresh_import("hangwatch.integrations.transformers")


# --- lightning ----------------------------------------------------------------------------------------------------


def run_lightning_fit(cb, trainer):
    """Hook order of `Trainer.fit` with a sanity check, 2 epochs of 2 batches, validation and a checkpoint per epoch
    (ModelCheckpoint runs last, after the other callbacks' on_validation_end)."""
    cb.on_sanity_check_start(trainer, None)
    cb.on_validation_start(trainer, None)
    cb.on_validation_batch_end(trainer, None, None, None, 0)
    cb.on_validation_end(trainer, None)
    cb.on_sanity_check_end(trainer, None)
    for _epoch in range(2):
        cb.on_train_epoch_start(trainer, None)
        for batch_idx in range(2):
            cb.on_train_batch_start(trainer, None, None, batch_idx)
            trainer.global_step += 1
            cb.on_train_batch_end(trainer, None, None, None, batch_idx)
        cb.on_validation_start(trainer, None)
        cb.on_validation_batch_end(trainer, None, None, None, 0, 0)
        cb.on_validation_end(trainer, None)
        cb.on_save_checkpoint(trainer, None, {})
        cb.on_train_epoch_end(trainer, None)
    cb.on_train_end(trainer, None)
    cb.teardown(trainer, None, "fit")


LIGHTNING_EXPECTED = (
    [begin("evaluation"), beat(), end("evaluation")]
    + [beat(1), beat(2), begin("evaluation"), beat(), end("evaluation"), begin("checkpoint")]
    + [end("checkpoint"), beat(3), beat(4), begin("evaluation"), beat(), end("evaluation")]
    + [begin("checkpoint"), end("checkpoint")]
)


def test_lightning_callback_with_stand_in_base(recorder, isolated_modules):
    base = type("Callback", (StandInBase,), {})
    stand_in("lightning")
    stand_in("lightning.pytorch", Callback=base)
    cb = fresh_import("hangwatch.integrations.lightning").HangwatchCallback()
    assert isinstance(cb, base)
    run_lightning_fit(cb, SimpleNamespace(global_step=0))
    assert events(recorder) == LIGHTNING_EXPECTED


def test_lightning_falls_back_to_pytorch_lightning(recorder, isolated_modules):
    sys.modules["lightning"] = None
    base = type("Callback", (), {})
    stand_in("pytorch_lightning", Callback=base)
    module = fresh_import("hangwatch.integrations.lightning")
    assert isinstance(module.HangwatchCallback(), base)
    assert isinstance(fresh_import("hangwatch.integrations.pytorch_lightning").HangwatchCallback(), base)


def test_lightning_exception_closes_open_phases(recorder, isolated_modules):
    stand_in("lightning")
    stand_in("lightning.pytorch", Callback=type("Callback", (), {}))
    cb = fresh_import("hangwatch.integrations.lightning").HangwatchCallback()
    trainer = SimpleNamespace(global_step=0)
    cb.on_validation_start(trainer, None)
    cb.on_exception(trainer, None, RuntimeError("x"))
    cb.teardown(trainer, None, "fit")
    assert events(recorder) == [begin("evaluation"), end("evaluation")]


def test_lightning_test_and_predict_loops_are_evaluation(recorder, isolated_modules):
    stand_in("lightning")
    stand_in("lightning.pytorch", Callback=type("Callback", (StandInBase,), {}))
    cb = fresh_import("hangwatch.integrations.lightning").HangwatchCallback()
    trainer = SimpleNamespace(global_step=4)
    # A checkpoint left open by the end of fit (no teardown yet) ends when the test loop starts.
    cb.on_save_checkpoint(trainer, None, {})
    cb.on_test_start(trainer, None)
    for batch_idx in range(2):
        cb.on_test_batch_end(trainer, None, None, None, batch_idx, 0)
    cb.on_test_end(trainer, None)
    cb.on_test_end(trainer, None)
    cb.teardown(trainer, None, "test")
    cb.on_predict_start(trainer, None)
    cb.on_predict_start(trainer, None)
    cb.on_predict_batch_end(trainer, None, None, None, 0, 0)
    cb.on_predict_end(trainer, None)
    cb.teardown(trainer, None, "predict")
    assert events(recorder) == [
        begin("checkpoint"),
        end("checkpoint"),
        begin("evaluation"),
        beat(),
        beat(),
        end("evaluation"),
        begin("evaluation"),
        beat(),
        end("evaluation"),
    ]


@pytest.mark.skipif(HAS_LIGHTNING, reason="lightning is installed")
def test_lightning_missing_says_what_to_install(isolated_modules):
    with pytest.raises(ImportError, match="pip install lightning"):
        fresh_import("hangwatch.integrations.lightning")


# --- accelerate ---------------------------------------------------------------------------------------------------


class StandInAccelerator:
    """The methods `watch` wraps, with accelerate's names and call shapes."""

    def __init__(self):
        self.calls = []

    def backward(self, loss, **kwargs):
        self.calls.append(("backward", loss))

    def save_state(self, output_dir=None, **kwargs):
        self.calls.append(("save_state", output_dir))
        return output_dir

    def load_state(self, input_dir=None, **kwargs):
        self.calls.append(("load_state", input_dir))

    def save_model(self, model, save_directory, **kwargs):
        raise OSError("disk full")


def test_accelerate_watch_beats_and_phases(recorder):
    from hangwatch.integrations.accelerate import watch

    acc = StandInAccelerator()
    assert watch(acc) is acc
    assert watch(acc) is acc
    acc.load_state("ckpt/0")
    for loss in (1.0, 2.0, 3.0):
        acc.backward(loss)
    assert acc.save_state("ckpt/1") == "ckpt/1"
    with pytest.raises(OSError, match="disk full"):
        acc.save_model(None, "out")
    assert acc.calls == [
        ("load_state", "ckpt/0"),
        ("backward", 1.0),
        ("backward", 2.0),
        ("backward", 3.0),
        ("save_state", "ckpt/1"),
    ]
    assert events(recorder) == [
        begin("load"),
        end("load"),
        beat(1),
        beat(2),
        beat(3),
        begin("checkpoint"),
        end("checkpoint"),
        begin("checkpoint"),
        end("checkpoint"),
    ]


def test_accelerate_module_does_not_import_accelerate(isolated_modules):
    # transformers imports accelerate where torch is installed; forget it here (isolated_modules puts it back).
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        del sys.modules[name]
    fresh_import("hangwatch.integrations.accelerate")
    assert "accelerate" not in sys.modules


def test_callbacks_never_raise_on_objects_without_the_expected_fields(recorder, isolated_modules):
    stand_in("transformers", TrainerCallback=type("TrainerCallback", (), {}))
    stand_in("lightning")
    stand_in("lightning.pytorch", Callback=type("Callback", (StandInBase,), {}))
    hf = fresh_import("hangwatch.integrations.transformers").HangwatchCallback()
    for hook in (
        "on_train_begin",
        "on_epoch_begin",
        "on_step_begin",
        "on_step_end",
        "on_substep_end",
        "on_epoch_end",
        "on_prediction_step",
        "on_evaluate",
        "on_predict",
        "on_save",
        "on_train_end",
    ):
        getattr(hf, hook)(None, None, None)
    pl = fresh_import("hangwatch.integrations.lightning").HangwatchCallback()
    pl.on_train_batch_end(None, None, None, None, 0)
    pl.on_sanity_check_start(None, None)
    pl.on_validation_start(None, None)
    pl.on_test_start(None, None)
    pl.on_test_batch_end(None, None, None, None, 0)
    pl.on_predict_batch_end(None, None, None, None, 0)
    pl.on_save_checkpoint(None, None, None)
    pl.teardown(None, None, "fit")
    assert ("beat", ["-"]) in recorder.seen
