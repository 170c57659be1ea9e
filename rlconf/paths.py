"""Looking at a path from the plan on this machine without letting an OSError escape.

The compiler stats paths the plan names (the plan file, `base:`, model and tokenizer directories,
data files, the reward file, checkpoint and run directories). A path that does not exist is no
problem here: it may be a hub id, or exist only on the cluster the plan runs on. A stat that fails
for another reason (a name too long for the file system, a file where a directory should be, a
directory this user may not enter) fails the same way when the run starts, so `probe` turns it
into a reason for people, and the caller into a located diagnostic.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import NamedTuple

# POSIX minimums Linux and macOS use when the file system does not say (os.pathconf).
DEFAULT_NAME_MAX, DEFAULT_PATH_MAX = 255, 4096
SHOWN_CHARS = 80  # a path longer than this is shown shortened in messages


class PathProblem(NamedTuple):
    reason: str  # "`a_file` is a file, not a directory"
    help: str


def shorten(text: str) -> str:
    """`text` as written when short; else its head and tail with its length, so a message stays one line."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:48]}…{text[-24:]} ({len(text)} characters)"


def expand(path: str) -> Path:
    """`~` expanded as the engine does (os.path.expanduser never raises, unlike Path.expanduser)."""
    return Path(os.path.expanduser(path))


def probe(path: str | os.PathLike) -> PathProblem | None:
    """Why stat(`path`) fails, or None when it succeeds or finds nothing there."""
    try:
        os.stat(path)
    except FileNotFoundError:
        # The lookup stops at the first missing directory, before a name too long further on;
        # that name cannot exist on this machine either.
        return _too_long(Path(path)) if _over_limits(Path(path)) else None
    except OSError as exc:
        return explain_os_error(Path(path), exc)
    except ValueError:  # an embedded NUL byte: no file system takes it
        return PathProblem("it contains a NUL byte", "remove the NUL byte from the path")
    return None


def is_dir(path: str | os.PathLike) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def explain_os_error(path: Path, exc: OSError) -> PathProblem:
    if exc.errno == errno.ENAMETOOLONG:
        return _too_long(path)
    if exc.errno == errno.ENOTDIR:
        blocker = _first_non_directory(path)
        where = f"`{shorten(str(blocker))}` is a file, not a directory" if blocker else "a part of it is not a directory"
        return PathProblem(where, "check the path: a file's name cannot be followed by `/...`")
    if exc.errno in (errno.EACCES, errno.EPERM):
        locked = _first_unsearchable_directory(path)
        who = f"this user (uid {os.geteuid()})" if hasattr(os, "geteuid") else "this user"
        where = f"`{shorten(str(locked))}`" if locked else "a directory on the way"
        return PathProblem(f"permission denied: {who} may not look inside {where}",
                           f"check the directory's permissions (`ls -ld {shorten(str(locked or path))}`) "
                           "or use a path this user can read")
    if exc.errno == errno.ELOOP:
        return PathProblem("too many levels of symbolic links (a symlink loop?)", "check the symlinks on the path")
    return PathProblem(exc.strerror or type(exc).__name__, "check the path")


def _longest_name(path: Path) -> str:
    return max(path.parts, key=lambda part: len(os.fsencode(part)), default="")


def _over_limits(path: Path) -> bool:
    name_max, path_max = _limits(path)
    return len(os.fsencode(_longest_name(path))) > name_max or len(os.fsencode(str(path))) >= path_max


def _too_long(path: Path) -> PathProblem:
    name_max, path_max = _limits(path)
    longest = _longest_name(path)
    if len(os.fsencode(longest)) > name_max:
        reason = (f"the name `{shorten(longest)}` is {len(os.fsencode(longest))} bytes, over the {name_max} "
                  "a file name may have here")
    else:
        reason = f"it is {len(os.fsencode(str(path)))} bytes long, over the {path_max} a path may have here"
    return PathProblem(reason, "use a shorter path (a symlink with a short name can stand in for a deep directory)")


def _limits(path: Path) -> tuple[int, int]:
    anchor = next((p for p in path.absolute().parents if is_dir(p)), Path("/"))
    try:
        return os.pathconf(anchor, "PC_NAME_MAX"), os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # AttributeError: no pathconf (Windows)
        return DEFAULT_NAME_MAX, DEFAULT_PATH_MAX


def _prefixes(path: Path) -> list[Path]:
    """`a/b/c` -> [a, a/b, a/b/c]: each step a lookup takes."""
    return [*reversed(path.parents[:-1]), path] if path.parents else [path]


def _first_non_directory(path: Path) -> Path | None:
    for prefix in _prefixes(path)[:-1]:
        try:
            if not stat.S_ISDIR(os.stat(prefix).st_mode):
                return prefix
        except (OSError, ValueError):
            return None
    return None


def _first_unsearchable_directory(path: Path) -> Path | None:
    for prefix in _prefixes(path):
        try:
            os.stat(prefix)
        except PermissionError:
            return prefix.parent
        except (OSError, ValueError):
            return None
    return None
