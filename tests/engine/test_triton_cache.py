"""engine/triton_cache.py against a fake Triton: one folder per kernel key whatever TRITON_CACHE_DIR says.

The fake (`FAKE_TRITON`) has what the module touches of Triton 3.5.1-3.7.1 (python/triton/runtime/cache.py and
knobs.py): FileCacheManager(key, override=False, dump=False) whose folder is knobs.cache.dir (TRITON_CACHE_DIR,
else $TRITON_HOME/.triton/cache) joined with the key, and get_cache_manager / get_override_manager /
get_dump_manager building `knobs.cache.manager_class or FileCacheManager`, that class read from
TRITON_CACHE_MANAGER each time, as Triton does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import triton_cache

FAKE_TRITON = {
    "__init__.py": '__version__ = "3.6.0+fake"\n',
    "knobs.py": '''
        import importlib
        import os


        class CacheKnobs:
            """Read at every access, as Triton's env descriptors are."""

            def home_folder(self, name):
                return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~/"), ".triton", name)

            @property
            def dir(self):
                return os.environ.get("TRITON_CACHE_DIR") or self.home_folder("cache")

            @property
            def override_dir(self):
                return os.environ.get("TRITON_OVERRIDE_DIR") or self.home_folder("override")

            @property
            def dump_dir(self):
                return os.environ.get("TRITON_DUMP_DIR") or self.home_folder("dump")

            @property
            def manager_class(self):
                named = os.environ.get("TRITON_CACHE_MANAGER")
                if named is None:
                    return None
                module, _, name = named.partition(":")
                cls = getattr(importlib.import_module(module), name)
                if not any(c.__name__ == "CacheManager" for c in cls.mro()):
                    raise RuntimeError(f"{named} is not a CacheManager")
                return cls


        cache = CacheKnobs()
    ''',
    "runtime/__init__.py": "",
    "runtime/cache.py": '''
        import base64
        import json
        import os
        import uuid

        from triton import knobs


        class CacheManager:
            def __init__(self, key, override=False, dump=False):
                pass


        class FileCacheManager(CacheManager):
            def __init__(self, key, override=False, dump=False):
                self.key = key
                self.lock_path = None
                if dump:
                    self.cache_dir = os.path.join(knobs.cache.dump_dir, key)
                    self.lock_path = os.path.join(self.cache_dir, "lock")
                    os.makedirs(self.cache_dir, exist_ok=True)
                elif override:
                    self.cache_dir = os.path.join(knobs.cache.override_dir, key)
                else:
                    self.cache_dir = os.path.join(knobs.cache.dir, key)
                    self.lock_path = os.path.join(self.cache_dir, "lock")
                    os.makedirs(self.cache_dir, exist_ok=True)

            def _make_path(self, filename):
                return os.path.join(self.cache_dir, filename)

            def get_file(self, filename):
                path = self._make_path(filename)
                return path if os.path.exists(path) else None

            def put(self, data, filename, binary=True):
                if self.lock_path is None:
                    raise RuntimeError("lock_path is None")
                scratch = os.path.join(self.cache_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
                os.makedirs(scratch)
                written = os.path.join(scratch, filename)
                with open(written, "wb" if isinstance(data, bytes) else "w") as f:
                    f.write(data)
                os.replace(written, self._make_path(filename))
                os.removedirs(scratch)
                return self._make_path(filename)


        def _base32(key):
            return base64.b32encode(bytes.fromhex(key)).decode().rstrip("=")


        def get_cache_manager(key):
            return (knobs.cache.manager_class or FileCacheManager)(_base32(key))


        def get_override_manager(key):
            return (knobs.cache.manager_class or FileCacheManager)(_base32(key), override=True)


        def get_dump_manager(key):
            return (knobs.cache.manager_class or FileCacheManager)(_base32(key), dump=True)
    ''',
}

KERNEL_KEY = "ab" * 32  # a sha256 in hex, as Triton's compiler hands it over
BASE32_KEY = "VOV2XK5LVOV2XK5LVOV2XK5LVOV2XK5LVOV2XK5LVOV2XK5LVOVQ"


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "triton" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def forget_triton() -> None:
    for name in [name for name in sys.modules if name == "triton" or name.startswith("triton.")]:
        del sys.modules[name]


TRITON_VARIABLES = ("TRITON_CACHE_MANAGER", "TRITON_CACHE_DIR", "TRITON_OVERRIDE_DIR", "TRITON_DUMP_DIR",
                    "TRITON_HOME", triton_cache.SWITCH, triton_cache.ROOT_VARIABLE)


@pytest.fixture
def folders(tmp_path: Path):
    """A clean Triton environment in tmp_path: the shared root, Triton's home, two vLLM-style cache folders.

    The variables are restored by hand: install() sets TRITON_CACHE_MANAGER in os.environ itself."""
    paths = {name: tmp_path / name for name in ("shared", "home", "vllm_hash_a", "vllm_hash_b", "site")}
    saved = {variable: os.environ.pop(variable, None) for variable in TRITON_VARIABLES}
    os.environ["TRITON_HOME"] = str(paths["home"])
    os.environ[triton_cache.ROOT_VARIABLE] = str(paths["shared"])
    yield paths
    for variable, value in saved.items():
        os.environ.pop(variable, None)
        if value is not None:
            os.environ[variable] = value


@pytest.fixture
def fake_triton(folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    """The fake Triton importable as `triton` (whatever Triton this machine has is hidden meanwhile)."""
    write_package(folders["site"], FAKE_TRITON)
    saved = {name: module for name, module in sys.modules.items() if name == "triton" or name.startswith("triton.")}
    forget_triton()
    monkeypatch.syspath_prepend(str(folders["site"]))
    import triton.runtime.cache

    yield triton.runtime.cache
    forget_triton()
    sys.modules.update(saved)


def test_the_fake_triton_has_the_problem_a_cache_folder_per_vllm_configuration(fake_triton, folders, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    first = fake_triton.get_cache_manager(KERNEL_KEY)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_b"]))
    second = fake_triton.get_cache_manager(KERNEL_KEY)
    assert first.cache_dir != second.cache_dir  # what install() is for: without it, a new configuration starts cold


def test_install_names_the_shared_manager_when_no_manager_is_set(fake_triton):
    assert triton_cache.install() is None
    assert os.environ["TRITON_CACHE_MANAGER"] == "engine.triton_cache:SharedFileCacheManager"
    assert triton_cache.install() is None  # every engine start calls it again: nothing changes


def test_a_users_own_cache_manager_is_never_replaced(fake_triton, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "their_package.cache:RemoteManager")
    assert "their_package.cache:RemoteManager" in triton_cache.install()
    assert os.environ["TRITON_CACHE_MANAGER"] == "their_package.cache:RemoteManager"


def test_a_kernel_compiled_under_one_vllm_cache_folder_is_found_under_another(fake_triton, folders, monkeypatch):
    triton_cache.install()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))  # what vLLM sets for its first configuration
    compiled = fake_triton.get_cache_manager(KERNEL_KEY)
    cubin = compiled.put(b"\x7fELF kernel", "kernel.cubin")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_b"]))  # a new max_num_seqs: a new folder
    later = fake_triton.get_cache_manager(KERNEL_KEY)
    assert type(later).__name__ == "SharedFileCacheManager"
    assert later.cache_dir == compiled.cache_dir == str(folders["shared"] / BASE32_KEY)
    assert later.get_file("kernel.cubin") == cubin and Path(cubin).read_bytes() == b"\x7fELF kernel"


def test_inductor_finds_the_entry_under_the_triton_cache_dir_vllm_set(fake_triton, folders, monkeypatch):
    # torch's Inductor reads TRITON_CACHE_DIR/<key>/<kernel>.cubin by path (its static launcher, its Triton bundle).
    triton_cache.install()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    fake_triton.get_cache_manager(KERNEL_KEY).put(b"cubin", "kernel.cubin")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_b"]))
    fake_triton.get_cache_manager(KERNEL_KEY)  # a later configuration's lookup links its folder too
    for vllm_folder in ("vllm_hash_a", "vllm_hash_b"):
        assert (folders[vllm_folder] / BASE32_KEY / "kernel.cubin").read_bytes() == b"cubin"
    assert not (folders["vllm_hash_a"] / BASE32_KEY).resolve().is_relative_to(folders["vllm_hash_a"])


def test_an_inductor_folder_already_there_is_left_alone(fake_triton, folders, monkeypatch):
    written_by_inductor = folders["vllm_hash_a"] / BASE32_KEY
    written_by_inductor.mkdir(parents=True)
    (written_by_inductor / "kernel.cubin").write_bytes(b"from the FX graph cache")
    triton_cache.install()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    manager = fake_triton.get_cache_manager(KERNEL_KEY)
    assert manager.cache_dir == str(folders["shared"] / BASE32_KEY) and not written_by_inductor.is_symlink()
    assert (written_by_inductor / "kernel.cubin").read_bytes() == b"from the FX graph cache"


def test_override_and_dump_managers_keep_tritons_folders(fake_triton, folders, monkeypatch):
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(folders["home"] / "my_overrides"))
    triton_cache.install()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    override = fake_triton.get_override_manager(KERNEL_KEY)
    dump = fake_triton.get_dump_manager(KERNEL_KEY)
    assert type(override).__name__ == type(dump).__name__ == "SharedFileCacheManager"  # Triton builds them from it
    assert override.cache_dir == str(folders["home"] / "my_overrides" / BASE32_KEY) and override.lock_path is None
    assert dump.cache_dir == str(folders["home"] / ".triton" / "dump" / BASE32_KEY)
    assert dump.lock_path == os.path.join(dump.cache_dir, "lock")
    assert not (folders["shared"] / BASE32_KEY).exists()


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_rlconf_triton_shared_cache_0_leaves_triton_as_vllm_sets_it(fake_triton, folders, monkeypatch, value):
    monkeypatch.setenv(triton_cache.SWITCH, value)
    assert triton_cache.SWITCH in triton_cache.install()
    assert "TRITON_CACHE_MANAGER" not in os.environ
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    assert fake_triton.get_cache_manager(KERNEL_KEY).cache_dir == str(folders["vllm_hash_a"] / BASE32_KEY)


def test_the_switch_also_drops_a_manager_inherited_from_a_parent(fake_triton, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", triton_cache.MANAGER)  # the launch's process set it, this one says 0
    monkeypatch.setenv(triton_cache.SWITCH, "0")
    assert triton_cache.install() is not None
    assert "TRITON_CACHE_MANAGER" not in os.environ


def test_an_unwritable_shared_root_keeps_tritons_own_cache(fake_triton, folders, monkeypatch):
    blocker = folders["home"] / "a_file"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    monkeypatch.setenv(triton_cache.ROOT_VARIABLE, str(blocker / "triton"))
    assert "not writable" in triton_cache.install()
    assert "TRITON_CACHE_MANAGER" not in os.environ
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    assert fake_triton.get_cache_manager(KERNEL_KEY).cache_dir == str(folders["vllm_hash_a"] / BASE32_KEY)


def test_a_root_that_goes_away_after_install_falls_back_instead_of_failing_the_compile(fake_triton, folders,
                                                                                       monkeypatch):
    assert triton_cache.install() is None
    blocker = folders["home"] / "a_file"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    monkeypatch.setenv(triton_cache.ROOT_VARIABLE, str(blocker / "triton"))  # e.g. a disk remounted read-only
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    manager = fake_triton.get_cache_manager(KERNEL_KEY)
    assert manager.cache_dir == str(folders["vllm_hash_a"] / BASE32_KEY)
    assert Path(manager.put(b"cubin", "kernel.cubin")).read_bytes() == b"cubin"


def test_a_relative_root_is_made_absolute_so_links_resolve(fake_triton, folders, monkeypatch):
    monkeypatch.chdir(folders["home"].parent)
    monkeypatch.setenv(triton_cache.ROOT_VARIABLE, "relative_triton")
    assert triton_cache.shared_root(os.environ) == str(folders["home"].parent / "relative_triton")
    triton_cache.install()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folders["vllm_hash_a"]))
    fake_triton.get_cache_manager(KERNEL_KEY).put(b"cubin", "kernel.cubin")
    assert (folders["vllm_hash_a"] / BASE32_KEY / "kernel.cubin").read_bytes() == b"cubin"


def test_a_triton_whose_cache_api_changed_keeps_its_own_manager(folders, monkeypatch):
    changed = dict(FAKE_TRITON)
    changed["runtime/cache.py"] = FAKE_TRITON["runtime/cache.py"].replace(
        "def __init__(self, key, override=False, dump=False):\n                self.key",
        "def __init__(self, key, options=None):\n                self.key")
    write_package(folders["site"], changed)
    saved = {name: module for name, module in sys.modules.items() if name == "triton" or name.startswith("triton.")}
    forget_triton()
    monkeypatch.syspath_prepend(str(folders["site"]))
    try:
        import triton.runtime.cache

        assert "(key, override, dump)" in triton_cache.install()
        assert "TRITON_CACHE_MANAGER" not in os.environ
        # A child that inherited the variable from a process with another Triton gets Triton's own class.
        assert triton_cache.SharedFileCacheManager is triton.runtime.cache.FileCacheManager
    finally:
        forget_triton()
        sys.modules.update(saved)


def test_without_triton_the_module_imports_and_install_does_nothing(folders):
    code = ("import os, sys; sys.modules['triton'] = None\n"
            "from engine import triton_cache\n"
            "print(triton_cache.install(), os.environ.get('TRITON_CACHE_MANAGER'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Triton is not installed None"


def test_the_shared_root_is_rlconf_triton_cache_dir_else_under_the_home_cache():
    assert triton_cache.shared_root({"RLCONF_TRITON_CACHE_DIR": "/scratch/triton"}) == "/scratch/triton"
    assert triton_cache.shared_root({}) == os.path.expanduser("~/.cache/rlconf/triton")
    # Not $RLCONF_CACHE_DIR: tests and benchmarks set that to a fresh folder, which would start Triton cold.
    assert triton_cache.shared_root({"RLCONF_CACHE_DIR": "/tmp/run1"}) == os.path.expanduser("~/.cache/rlconf/triton")


def test_import_vllm_installs_the_shared_cache_before_importing_vllm(fake_triton, monkeypatch):
    pytest.importorskip("torch")
    from engine.rollout.vllm import RolloutSetupError, import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM missing: import_vllm says how to get it
    with pytest.raises(RolloutSetupError):
        import_vllm()
    assert os.environ["TRITON_CACHE_MANAGER"] == triton_cache.MANAGER


def test_with_the_real_triton_a_built_module_is_reused_under_a_new_triton_cache_dir(folders):
    """Where Triton is installed (the GPU machines): its own get_cache_manager, override and dump managers, and
    runtime.build.compile_module_from_src (how Triton builds its C launchers with gcc) through the shared cache."""
    real = pytest.importorskip("triton.runtime.build")
    from triton.runtime import cache

    assert triton_cache.install() is None
    os.environ["TRITON_CACHE_DIR"] = str(folders["vllm_hash_a"])
    manager = cache.get_cache_manager(KERNEL_KEY)
    assert type(manager).__name__ == "SharedFileCacheManager" and manager.cache_dir.startswith(str(folders["shared"]))
    assert not cache.get_override_manager(KERNEL_KEY).cache_dir.startswith(str(folders["shared"]))
    assert cache.get_dump_manager(KERNEL_KEY).cache_dir.startswith(str(folders["home"]))
    source = ("#include <Python.h>\n"
              'static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "rlconf_probe", NULL, -1};\n'
              "PyMODINIT_FUNC PyInit_rlconf_probe(void) { return PyModule_Create(&probe); }\n")

    def built() -> list[tuple[str, int]]:  # a rebuild replaces the file: a new inode
        return [(name, os.stat(os.path.join(folder, name)).st_ino) for folder, _, names in os.walk(folders["shared"])
                for name in names if name.startswith("rlconf_probe")]

    real.compile_module_from_src(source, "rlconf_probe")
    first = built()
    os.environ["TRITON_CACHE_DIR"] = str(folders["vllm_hash_b"])
    real.compile_module_from_src(source, "rlconf_probe")  # found in the shared folder: nothing built again
    assert len(first) == 1 and built() == first
