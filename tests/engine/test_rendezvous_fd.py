"""Rank 0's rendezvous socket is closed once, by the TCPStore that took its descriptor (engine/workers/cluster/device.py).

The store's server closes the descriptor when the process group goes; a Python socket object that
still believed it owned the number closed it a second time when collected, by then maybe another
object's descriptor (a full CI run aborted at exit: gloo's epoll loop found its descriptor closed).
"""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")


def test_the_rendezvous_descriptor_is_not_closed_again_after_the_store_closed_it():
    import torch.distributed as dist

    from engine.workers.cluster import device

    port = device.listen_for_rendezvous("127.0.0.1")
    fd = device._rendezvous_sockets[port].fileno()
    device.set_rendezvous_env(0, 1, "127.0.0.1", port, "127.0.0.1")
    device.join_process_group(torch.device("cpu"), 0, 1)
    dist.destroy_process_group()
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the store's server closed it with the group
    # Something else now takes the number, as the next group's descriptors do.
    reused = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: fd itself, most likely
    if reused != fd:
        os.dup2(reused, fd)
        os.close(reused)
    try:
        device._rendezvous_sockets.clear()  # what exit does to the module's sockets
        gc.collect()
        os.fstat(fd)  # still open: nothing closed it a second time
    finally:
        os.close(fd)
