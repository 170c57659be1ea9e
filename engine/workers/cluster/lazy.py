"""The Ray actor every worker runs in: it imports the worker's module at once and builds the worker later.

A worker's module imports torch, transformers and the engine's models: seconds on a GPU machine. Spawned
from the module's name, right after Ray starts, a worker process does those imports while the driver does
its own start-up (importing the engine, preparing the model files, reading the data); the worker itself is
built once what it needs is known (`build`). Every call reaches the worker through `actor.__ray_call__`
(`invoke`), so the actor class needs no method list of its own and the worker classes stay plain Python;
the functions it runs there read and set the worker's attributes through the actor.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any


class LazyWorker:
    """Holds the worker class (imported in `__init__`) and, after `build`, the worker; attributes not its own
    are the worker's, so functions run through `__ray_call__` see the worker's."""

    def __init__(self, spec: type | tuple[str, str], preload: tuple[str, ...] = ()) -> None:
        """`spec`: the worker class, or its (module, qualified name); `preload`: modules the worker will import
        later anyway (vLLM), imported now, while the driver is still busy. One that fails to import is left to
        the worker, which says what to install when it needs it."""
        from engine.interrupt import with_injected_signal

        cls = spec if isinstance(spec, type) else import_class(*spec)
        # A test's injected signal (engine.interrupt): the variable is in the workers' environment too.
        self._cls = with_injected_signal(cls)
        self._worker: Any = None
        for module in preload:
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - ImportError or a broken install: the worker's own import reports it
                pass

    def stream_call(self, method: str, *args: Any) -> Iterator[Any]:
        """`worker.method(*args)`, a generator, as a Ray streaming call: each thing it yields reaches the caller as
        it is yielded (Ray asks a streaming method to be a generator function itself, which `invoke` through
        `__ray_call__` is not)."""
        yield from getattr(self._worker, method)(*args)

    def __getattr__(self, name: str) -> Any:
        # Called only for names this object lacks; a worker not built yet has none to give.
        worker = self.__dict__.get("_worker")
        if worker is None:
            raise AttributeError(f"{name!r}: the worker is not built yet (LazyWorker.build)")
        return getattr(worker, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Once built, what a function run through __ray_call__ sets is the worker's, as what it reads.
        worker = self.__dict__.get("_worker")
        if name in OWN or worker is None:
            object.__setattr__(self, name, value)
        else:
            setattr(worker, name, value)


OWN = ("_cls", "_worker")


def import_class(module: str, qualname: str) -> type:
    owner: Any = importlib.import_module(module)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


def build(actor: LazyWorker, kwargs: dict[str, Any]) -> str:
    """In the worker: construct it (`kwargs`: the worker class's constructor arguments); its class name back."""
    actor._worker = actor._cls(**kwargs)
    return actor._cls.__name__


def invoke(actor: LazyWorker, method: str, *args: Any) -> Any:
    """In the worker: `worker.method(*args)`."""
    return getattr(actor._worker, method)(*args)


def spec_name(spec: type | tuple[str, str]) -> str:
    return spec.__name__ if isinstance(spec, type) else spec[1].rsplit(".", 1)[-1]
