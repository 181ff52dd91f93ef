"""hangwatch's bootstrap, put first on the ranks' PYTHONPATH by `hangwatch run` (docs/inside-evidence.md).

Python imports `sitecustomize` at startup; this one (1) runs the `sitecustomize` the job had before, found further
along `sys.path`, exactly as Python would have, and (2) asks hangwatch's client to watch imports, so that a job that
imports torch (transformers, Lightning, accelerate) gets beats on its optimizer steps and checkpoint phases without a
change to its code. It imports nothing beyond the standard library until the job imports one of those, and never
raises into the job. `HANGWATCH_INSTRUMENT=0` turns it off.
"""


def _chain_to_the_jobs_own() -> None:
    """Imports the next `sitecustomize` on sys.path (the job's, or the environment's), as Python would have."""
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    position = None
    for i, entry in enumerate(sys.path):
        if os.path.abspath(entry or ".") == here:
            position = i
            break
    if position is not None:
        del sys.path[position]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            import traceback

            traceback.print_exc()
    except Exception:
        import traceback

        # What site.py does with a failing sitecustomize: say so and go on.
        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:", file=sys.stderr)
        traceback.print_exc()
    finally:
        # The client is imported from here later: the directory goes back where it was.
        if position is not None:
            sys.path.insert(min(position, len(sys.path)), here)
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours


# The modules hangwatch._auto.HOOKS hooks (python/tests/test_auto.py checks that the two lists agree).
WATCHED = (
    "torch",
    "torch.optim.optimizer",
    "torch.distributed.checkpoint",
    "transformers.trainer",
    "lightning.pytorch.trainer.trainer",
    "pytorch_lightning.trainer.trainer",
    "accelerate.accelerator",
)


class _ImportWatcher:
    """Finds nothing itself: for a watched name it asks the finders after it and wraps the loader, so that
    hangwatch's hook runs right after the module loaded and before the job's code sees it. Every other import costs
    one tuple lookup."""

    def __init__(self) -> None:
        self._done = set()

    def find_spec(self, name, path=None, target=None):
        if name not in WATCHED or name in self._done:
            return None
        import sys

        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path, target)
            except Exception:
                return None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookingLoader(spec.loader, self, name)
        return spec

    def loaded(self, name, module):
        if name in self._done:
            return
        self._done.add(name)
        try:
            from hangwatch import _auto

            _auto.hook(name, module)
        except Exception:
            pass

    def invalidate_caches(self):
        pass


class _HookingLoader:
    """The real loader, then the hook; the module keeps the real loader (for inspect.getsource and the like)."""

    def __init__(self, loader, watcher, name):
        self._loader = loader
        self._watcher = watcher
        self._name = name

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        try:
            module.__loader__ = self._loader
        except Exception:
            pass
        self._loader.exec_module(module)
        self._watcher.loaded(self._name, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _instrument() -> None:
    import os
    import sys

    if os.environ.get("HANGWATCH_INSTRUMENT", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    watcher = _ImportWatcher()
    sys.meta_path.insert(0, watcher)
    # A framework the job's own sitecustomize already imported.
    for name in WATCHED:
        module = sys.modules.get(name)
        if module is not None:
            watcher.loaded(name, module)


_chain_to_the_jobs_own()
_instrument()
