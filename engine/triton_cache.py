"""One Triton kernel cache for every vLLM engine a worker starts, whatever the engine's configuration.

Why: vLLM's Inductor adaptor (vllm/compilation/compiler_interface.py, `InductorAdaptor.initialize_cache`) sets
TRITON_CACHE_DIR to a folder under its cache for one configuration hash (~/.cache/vllm/torch_compile_cache/<hash>/),
so a new max_num_seqs, batch size or CUDA graph size starts Triton from an empty cache. Measured on an H100
(vLLM 0.25, torch 2.11): the V2 model runner's `warmup_kernels` then compiles ~23 of vLLM's own kernels (sampler,
top-k log-softmax, ...) in 13-23 s, 12.5 s of it waiting on ptxas and on gcc building Triton's launcher stubs,
against 0.15 s when the hash was seen before. Triton's own key (its build, the kernel's source, options, backend
and target; a launcher's C source and the platform) already tells kernels apart, which is why Triton's default is
one folder for everything: sharing one is safe.

How (read from Triton 3.5.1, 3.6.0 and 3.7.1, python/triton/runtime/cache.py and knobs.py, identical there):
`get_cache_manager(key)` instantiates `knobs.cache.manager_class or FileCacheManager`, the class named by
TRITON_CACHE_MANAGER ("module:Class"), read from the environment each time a manager is made, not at import.
Every kernel compile (compiler.compile), every C module Triton builds with gcc (runtime.build.compile_module_from_src:
the NVIDIA driver's cuda_utils and, before 3.7, each kernel's launcher) and the autotuner's disk cache go through it.
`install()` names `SharedFileCacheManager` there: Triton's FileCacheManager with each entry under one root of ours
(`shared_root`) instead of TRITON_CACHE_DIR. `get_override_manager` / `get_dump_manager` build the same class with
override=True / dump=True: those stay exactly Triton's (TRITON_OVERRIDE_DIR, TRITON_DUMP_DIR).

torch's Inductor reads Triton's files by path under TRITON_CACHE_DIR, so each entry is also linked there
(`link_where_inductor_looks`). The price: vLLM's folder, copied to another machine, carries links, not kernels.

A user's own TRITON_CACHE_MANAGER is never replaced; RLCONF_TRITON_SHARED_CACHE=0 turns this off. This module
imports without Triton: the class is built on first access, once Triton has imported this module by name.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import tempfile
from collections.abc import Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

SWITCH = "RLCONF_TRITON_SHARED_CACHE"
ROOT_VARIABLE = "RLCONF_TRITON_CACHE_DIR"
MANAGER_VARIABLE = "TRITON_CACHE_MANAGER"
CLASS_NAME = "SharedFileCacheManager"
MANAGER = f"{__name__}:{CLASS_NAME}"
OFF = ("0", "false", "no", "off")
NOT_INSTALLED = "Triton is not installed"


def shared_root(environ: Mapping[str, str]) -> str:
    """The folder that holds every entry: $RLCONF_TRITON_CACHE_DIR, else ~/.cache/rlconf/triton.

    Not under $RLCONF_CACHE_DIR: tests and benchmarks point that at a fresh folder per run, and a cold Triton
    cache is what this module exists to avoid."""
    chosen = environ.get(ROOT_VARIABLE, "").strip()
    # Absolute: a link Inductor follows (link_where_inductor_looks) resolves from its own folder, not from here.
    return os.path.abspath(os.path.expanduser(chosen or os.path.join("~", ".cache", "rlconf", "triton")))


def root_problem(root: str) -> str | None:
    """Why Triton could not write its entries under `root` (None: it can). Checked before installing: a manager
    that cannot make its folder fails every compile, vLLM's start-up included."""
    try:
        os.makedirs(root, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
    except OSError as exc:
        return f"{root} is not writable ({exc.strerror or exc})"
    return None


def skip_reason(environ: Mapping[str, str]) -> str | None:
    """Why a process with this environment keeps Triton's own cache placement (None: it gets the shared one)."""
    switch = environ.get(SWITCH, "").strip()
    if switch.lower() in OFF:
        return f"{SWITCH}={switch}"
    current = environ.get(MANAGER_VARIABLE, "").strip()
    if current and current != MANAGER:
        return f"{MANAGER_VARIABLE}={current} is the user's own cache manager"
    return None


def api_problem(file_cache_manager: type) -> str | None:
    """What in Triton's FileCacheManager differs from what SharedFileCacheManager builds on (None: nothing)."""
    try:
        parameters = list(inspect.signature(file_cache_manager.__init__).parameters)[1:4]
    except (TypeError, ValueError) as exc:
        return f"FileCacheManager.__init__ has no readable signature ({exc})"
    if parameters != ["key", "override", "dump"]:
        return f"FileCacheManager.__init__ takes {parameters}, not (key, override, dump)"
    # The subclass places an entry itself rather than through FileCacheManager.__init__, so Triton's methods must
    # still find it in these attributes (_make_path joins cache_dir and a file name; put refuses lock_path None).
    names: set[str] = set()
    for method in ("_make_path", "put"):
        code = getattr(getattr(file_cache_manager, method, None), "__code__", None)
        names.update(code.co_names if code is not None else ())
    missing = sorted({"cache_dir", "lock_path"} - names)
    if missing:
        return f"FileCacheManager._make_path / put no longer use {', '.join(missing)}"
    return None


def triton_problem() -> str | None:
    """Why this process's Triton cannot take SharedFileCacheManager (None: it can)."""
    try:
        if importlib.util.find_spec("triton") is None:
            return NOT_INSTALLED
        from triton.runtime.cache import FileCacheManager
    except Exception as exc:  # noqa: BLE001 - a broken Triton install: keep its default, say why
        return f"triton.runtime.cache.FileCacheManager cannot be imported ({type(exc).__name__}: {exc})"
    return api_problem(FileCacheManager)


@functools.cache
def note_once(message: str, warn: bool) -> None:
    """Log `message` the first time only: install() runs at every engine start, Triton reads the class often."""
    (log.warning if warn else log.info)(message)


def uninstall_inherited(environ: MutableMapping[str, str]) -> None:
    """Drop a TRITON_CACHE_MANAGER naming ours that this process inherited: the switch or a problem says no."""
    if environ.get(MANAGER_VARIABLE, "").strip() == MANAGER:
        del environ[MANAGER_VARIABLE]


def install() -> str | None:
    """Point this process's Triton at SharedFileCacheManager (TRITON_CACHE_MANAGER), before vLLM starts an engine.

    Returns why not (None: installed, or already was). Triton reads the variable when it makes a cache manager,
    so what counts is that it is set before the engine's first compile; children (Inductor's compile workers, an
    engine core in its own process) inherit it and import this module by name, as this process's sys.path allows."""
    reason = skip_reason(os.environ)
    problem = None if reason else triton_problem() or root_problem(shared_root(os.environ))
    if reason is None and problem is None:
        os.environ[MANAGER_VARIABLE] = MANAGER
        return None
    uninstall_inherited(os.environ)
    # An unexpected Triton is worth a warning; the user's choice, or no Triton at all, is not.
    note_once(f"Triton's kernel cache stays where vLLM puts it (one folder per vLLM configuration): "
              f"{reason or problem}", warn=problem not in (None, NOT_INSTALLED))
    return reason or problem


def link_where_inductor_looks(entry: str, key: str, triton_cache_dir: str | None) -> None:
    """Make `triton_cache_dir/key` a link to the shared `entry` (TRITON_CACHE_DIR, as vLLM set it).

    torch's Inductor finds a kernel's files by that path, past the cache manager (torch/_inductor: the static
    launcher's cubin, runtime_utils.triton_cache_dir; the FX graph cache's Triton bundle, triton_bundler.py):
    without the link it would miss them and fall back to slower paths."""
    if not triton_cache_dir or not triton_cache_dir.strip():
        return  # Triton's default folder: Inductor sets TRITON_CACHE_DIR before it compiles, so it never reads that
    view = os.path.join(triton_cache_dir.strip(), key)
    if os.path.lexists(view):
        return  # linked already, a folder Inductor's bundle wrote, or `entry` itself (the same root)
    try:
        os.makedirs(os.path.dirname(view), exist_ok=True)
        os.symlink(entry, view, target_is_directory=True)
    except OSError:
        pass  # another process linked it first, or no links on this file system: Triton's own lookups need none


@functools.cache
def shared_manager_class(file_cache_manager: type) -> type:
    """Triton's `file_cache_manager` with its entries under `shared_root` (cached: one class per Triton)."""

    class SharedFileCacheManager(file_cache_manager):  # type: ignore[misc, valid-type]
        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            if override or dump:
                # TRITON_OVERRIDE_DIR / TRITON_DUMP_DIR: debugging folders a user chose, Triton's as they are.
                super().__init__(key, override=override, dump=dump)
                return
            entry = os.path.join(shared_root(os.environ), key)
            try:
                os.makedirs(entry, exist_ok=True)
            except OSError as exc:
                # install() checked the root; should it go away since (a full or remounted disk), compile into
                # Triton's own folder rather than fail the compile, and the engine's start with it.
                note_once(f"Triton's kernel cache falls back to TRITON_CACHE_DIR: {entry}: {exc}", warn=True)
                super().__init__(key)
                return
            self.key, self.cache_dir, self.lock_path = key, entry, os.path.join(entry, "lock")
            link_where_inductor_looks(entry, key, os.environ.get("TRITON_CACHE_DIR"))

    SharedFileCacheManager.__qualname__ = CLASS_NAME  # what TRITON_CACHE_MANAGER names
    return SharedFileCacheManager


def __getattr__(name: str) -> Any:
    """`SharedFileCacheManager`, built on the Triton that asks for it (TRITON_CACHE_MANAGER names it)."""
    if name != CLASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from triton.runtime.cache import FileCacheManager

    problem = api_problem(FileCacheManager)
    if problem is not None:
        # A child that inherited the variable from a process with another Triton: Triton's own class, unchanged.
        note_once(f"Triton's kernel cache stays where vLLM puts it: {problem}", warn=True)
        return FileCacheManager
    return shared_manager_class(FileCacheManager)
