"""Pydantic's plugin loader, imported only when plugins are wanted.

Every pydantic validator is built through `pydantic.plugin._loader.get_plugins`. Importing that
module imports `importlib.metadata` (with email, zipfile, csv and importlib.resources behind it),
about 17 ms of a cold `rlconf validate`, even while PYDANTIC_DISABLE_PLUGINS turns plugins off, as
typer does around the validators it builds for CLI parameters and rlconf does around the plan's
(rlconf/compile.py). `defer_plugin_loader` puts a stand-in under that module name: with plugins
switched off it answers "no plugins", as pydantic's loader does; otherwise it imports pydantic's
loader in its own place and asks it. So a command that validates with plugins off never imports
`importlib.metadata`, and one that wants plugins (the engine, with the switch unset) gets pydantic's
own loader, unchanged.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"
# The values for which pydantic's get_plugins returns no plugins at all (pydantic 2.x).
ALL_DISABLED = ("__all__", "1", "true")


def defer_plugin_loader() -> None:
    """Install the stand-in, unless pydantic's loader is imported already (then nothing is saved)."""
    if LOADER in sys.modules:
        return
    stand_in = types.ModuleType(LOADER, "rlconf.plugin_loader: a stand-in for pydantic's plugin loader")

    def get_plugins() -> Iterable[Any]:
        if os.environ.get("PYDANTIC_DISABLE_PLUGINS") in ALL_DISABLED:
            return ()
        if sys.modules.get(LOADER) is stand_in:
            del sys.modules[LOADER]  # from here on `from ._loader import get_plugins` finds pydantic's
        return importlib.import_module(LOADER).get_plugins()

    stand_in.get_plugins = get_plugins  # type: ignore[attr-defined]
    sys.modules[LOADER] = stand_in
