"""Why a launch stops before Ray starts: the engine does not run the plan, or this machine lacks something.

Both are messages for people, and a person needs to know which: "change the plan" and "install a
package / use a GPU machine" are different fixes. A problem of the machine is a `MachineShortfall`
(still a str, so every message stays a plain string); any other problem is the engine's.
"""

from __future__ import annotations


class MachineShortfall(str):
    """A problem of this machine, not of the plan: a package to install, a CUDA device, more GPUs."""


def closing_line(problems: list[str]) -> str:
    """The last line of a refused launch, naming which kind of fix the errors above need."""
    machine = any(isinstance(p, MachineShortfall) for p in problems)
    engine = any(not isinstance(p, MachineShortfall) for p in problems)
    if engine and machine:
        return ("the plan is valid, but this engine does not run part of it yet, and this machine lacks what "
                "the rest needs: change the plan where the errors above say, and install what they name")
    if engine:
        return ("the plan is valid, but this engine does not run it yet: change the settings the errors above "
                "name")
    return ("the plan is valid and this engine runs it, but this machine lacks what it needs: install what the "
            "errors above name, or launch on a machine that has it (`--address` joins a Ray cluster)")
