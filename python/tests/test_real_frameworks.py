"""The callbacks inside real training runs: `transformers.Trainer.train` and `lightning.Trainer.fit`/`test`/`predict`
on a tiny CPU model, with a real socket as the agent. Skipped unless torch and the framework are importable (both
need torch, which `python3` here usually lacks; run these with a Python that has them).

A second callback after hangwatch's takes what reached the socket after every framework hook, so the socket's queue
of ~11 datagrams never fills and every beat arrives: the order checked is the order the framework called the hooks.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

import hangwatch

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = HAS_TORCH and importlib.util.find_spec("transformers") is not None
HAS_LIGHTNING = HAS_TORCH and importlib.util.find_spec("lightning") is not None


def taking_callback(base, agent, got):
    """A `base` subclass whose every `on_*` hook takes the datagrams delivered so far."""

    def take(self, *args, **kwargs):
        got.extend(agent.take())

    hooks = {name: take for name in dir(base) if name.startswith("on_")}
    return type("Taker", (base,), hooks)()


def kinds(got):
    out = []
    for m in got:
        if m.type == "beat":
            out.append("beat " + m.fields[0])
        elif m.type == "phase":
            out.append(" ".join(m.fields))
    return out


def check_delivery(got):
    assert [m.seq for m in got] == list(range(1, len(got) + 1))
    assert {m.pid for m in got} == {os.getpid()}
    stats = hangwatch.stats()
    assert (stats["dropped"], stats["queued"]) == (0, 0)


def evaluation_run(batches):
    return ["begin evaluation"] + ["beat -"] * batches + ["end evaluation"]


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs torch and transformers")
def test_real_trainer_train_evaluate_predict(one_process, agent, tmp_path):
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from hangwatch.integrations.transformers import HangwatchCallback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def forward(self, x, labels=None):
            out = self.lin(x).squeeze(-1)
            return {"loss": ((out - labels) ** 2).mean(), "logits": out}

    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i % 3))} for i in range(6)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        eval_strategy="steps",
        eval_steps=2,
        eval_on_start=True,
        save_strategy="steps",
        save_steps=3,
        logging_steps=100,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    got = []
    trainer = Trainer(
        model=Tiny(),
        args=args,
        train_dataset=data,
        eval_dataset=data,
        callbacks=[HangwatchCallback(), taking_callback(TrainerCallback, agent, got)],
    )
    trainer.train()
    trainer.evaluate()
    trainer.predict(data)
    got.extend(agent.take())

    assert got[0].type == "hello"
    assert kinds(got) == (
        evaluation_run(3)
        + ["beat 1", "beat 2"]
        + evaluation_run(3)
        + ["beat 3", "begin checkpoint", "end checkpoint", "beat 4"]
        + evaluation_run(3)
        + ["beat 5", "beat 6"]
        + evaluation_run(3)
        + ["begin checkpoint", "end checkpoint"]
        + evaluation_run(3)
        + evaluation_run(3)
    )
    check_delivery(got)


@pytest.mark.skipif(not HAS_LIGHTNING, reason="needs torch and lightning")
def test_real_lightning_fit_test_predict(one_process, agent, tmp_path):
    import lightning.pytorch as pl
    import torch

    from hangwatch.integrations.lightning import HangwatchCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def loss(self, batch):
            x, y = batch
            return ((self.lin(x).squeeze(-1) - y) ** 2).mean()

        def training_step(self, batch, batch_idx):
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            return self.loss(batch)

        def test_step(self, batch, batch_idx):
            return self.loss(batch)

        def predict_step(self, batch, batch_idx):
            return self.lin(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dataset = torch.utils.data.TensorDataset(torch.randn(4, 2), torch.randn(4))

    def loader():
        return torch.utils.data.DataLoader(dataset, batch_size=2)

    got = []
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        default_root_dir=str(tmp_path),
        callbacks=[HangwatchCallback(), taking_callback(pl.Callback, agent, got)],
    )
    model = Tiny()
    trainer.fit(model, loader(), loader())
    trainer.test(model, loader())
    trainer.predict(model, loader())
    got.extend(agent.take())

    assert got[0].type == "hello"
    assert kinds(got) == (
        evaluation_run(1)
        + ["beat 1", "beat 2"]
        + evaluation_run(2)
        + ["begin checkpoint", "end checkpoint", "beat 3", "beat 4"]
        + evaluation_run(2)
        + ["begin checkpoint", "end checkpoint"]
        + evaluation_run(2)
        + evaluation_run(2)
    )
    check_delivery(got)
