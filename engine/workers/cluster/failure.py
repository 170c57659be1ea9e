"""What a worker group raises when a rank fails, and the rendezvous port: shared by the Ray and in-process groups.

Kept free of Ray so the in-process path (engine.workers.cluster.local) runs where Ray is not installed.
"""

from __future__ import annotations

import socket


class WorkerFailure(RuntimeError):
    def __init__(self, role: str, rank: int, cause: BaseException, node: str = "") -> None:
        """`node`: where the rank ran (Ray node address and id), when known."""
        self.role, self.rank, self.cause, self.node = role, rank, cause, node
        where = f" on node {node}" if node else ""
        super().__init__(f"worker {role} rank {rank}{where} failed: {_first_line(cause)}")


def _first_line(exc: BaseException) -> str:
    # RayTaskError wraps the remote traceback; its last non-empty line is the real error.
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def free_port() -> int:
    """A free TCP port on loopback for the torch.distributed rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
