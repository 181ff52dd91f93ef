"""The zero-code instrumentation: hangwatch's bootstrap `sitecustomize` as `run` lays it out (the bootstrap first on
PYTHONPATH, the client beside it), in real child Pythons. The torch tests need torch (scripts/test runs this file
again with the torch virtual environment); the others run anywhere.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from hangwatch import _auto

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOTSTRAP = os.path.join(ROOT, "python", "bootstrap", "sitecustomize.py")
CLIENT = os.path.join(ROOT, "python", "src", "hangwatch")
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture
def bootstrap(tmp_path):
    """The directory `run` writes: sitecustomize.py and the client package."""
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(open(BOOTSTRAP).read())
    os.symlink(CLIENT, boot / "hangwatch")
    return boot


def python(code, bootstrap, *extra_path, env=None, timeout=120):
    full = {k: v for k, v in os.environ.items() if not k.startswith("HANGWATCH_") and k not in ("RANK", "LOCAL_RANK")}
    full.update(env or {})
    full["PYTHONPATH"] = os.pathsep.join([str(bootstrap)] + [str(p) for p in extra_path])
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_bootstrap_watches_exactly_the_modules_the_client_hooks():
    tree = ast.parse(open(BOOTSTRAP).read())
    watched = next(ast.literal_eval(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "WATCHED")
    assert sorted(watched) == sorted(_auto.HOOKS)


def test_a_job_without_torch_imports_nothing_of_hangwatch(bootstrap):
    got = python("""
        import sys, json
        print(type(sys.meta_path[0]).__name__, any(m == "hangwatch" or m.startswith("hangwatch.") for m in sys.modules))
    """, bootstrap)
    assert got == ["_ImportWatcher", "False"]


def test_the_jobs_own_sitecustomize_still_runs_and_keeps_its_module(bootstrap, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "sitecustomize.py").write_text("import os\nos.environ['JOB_SITE'] = 'ran'\nMARK = 42\n")
    got = python("""
        import os, sys
        print(os.environ.get('JOB_SITE'), getattr(sys.modules.get('sitecustomize'), 'MARK', None),
              type(sys.meta_path[0]).__name__)
    """, bootstrap, job)
    assert got == ["ran", "42", "_ImportWatcher"]


def test_a_failing_sitecustomize_of_the_job_is_reported_as_python_would_and_the_job_goes_on(bootstrap, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("HANGWATCH_")}
    full["PYTHONPATH"] = os.pathsep.join([str(bootstrap), str(job)])
    out = subprocess.run([sys.executable, "-c", "print('job ran')"], env=full, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "job ran"
    assert "Error in sitecustomize" in out.stderr and "broken site" in out.stderr


def test_hangwatch_instrument_0_turns_it_off(bootstrap):
    got = python("""
        import sys
        print(any(type(f).__name__ == '_ImportWatcher' for f in sys.meta_path))
    """, bootstrap, env={"HANGWATCH_INSTRUMENT": "0"})
    assert got == ["False"]


TRAIN = """
    import os, sys, torch
    {before}
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({steps}):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        {each_step}
    torch.save(model.state_dict(), os.path.join({tmp!r}, "ckpt.pt"))
    from hangwatch import _auto, flush
    flush(5)
    s = _auto.stats()
    print(s["step_beats"], s["step_beats_stopped"], ",".join(sorted(s["hooked"])))
"""


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_optimizer_steps_beat_and_torch_save_is_a_checkpoint_phase(bootstrap, agent, tmp_path):
    got = python(TRAIN.format(before="", steps=4, each_step="", tmp=str(tmp_path)), bootstrap,
                 env={"HANGWATCH_SOCKET": agent.path})
    assert got == ["4", "False", "torch,torch.optim.optimizer"]
    kinds = [(m.type, " ".join(m.fields)) for m in agent.drain(0.3) if m.type in ("beat", "phase")]
    assert kinds == [("beat", "-")] * 4 + [("phase", "begin checkpoint"), ("phase", "end checkpoint")]


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_a_job_that_beats_itself_is_not_counted_twice(bootstrap, agent, tmp_path):
    got = python(TRAIN.format(before="import hangwatch", steps=5, each_step="hangwatch.beat(step)", tmp=str(tmp_path)),
                 bootstrap, env={"HANGWATCH_SOCKET": agent.path})
    # The first step beats once more (before the job's own beat is seen); then only the job's beats count.
    assert got == ["1", "True", "torch,torch.optim.optimizer"]
    beats = [m for m in agent.drain(0.3) if m.type == "beat"]
    assert len(beats) == 5 + 1


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_without_an_agent_the_instrumented_job_runs_unchanged(bootstrap, tmp_path):
    got = python(TRAIN.format(before="", steps=3, each_step="", tmp=str(tmp_path)), bootstrap)
    assert got == ["3", "False", "torch,torch.optim.optimizer"]
