"""Where a worker computes: its torch device and its process group (gloo on CPU, NCCL on GPU).

Batches travel between the controller and the workers on the CPU (Ray serializes them); a worker
moves its shard to its device on the way in and its results back to the CPU on the way out.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from engine.batch import TensorBatch


def interface_of(ip: str) -> str | None:
    """The name of this machine's network interface that holds `ip` (None: no interface has it)."""
    if ip.startswith("127."):
        return "lo"
    import fcntl
    import struct

    siocgifaddr = 0x8915  # Linux ioctl: an interface's IPv4 address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


RENDEZVOUS_TIMEOUT_S = 300  # every rank of a group is already placed when they meet

# Rank 0's rendezvous sockets by port: opened (bound and listening) before the group meets, then handed
# to the TCPStore by file descriptor (join_process_group), which owns it from there on.
_rendezvous_sockets: dict[int, socket.socket] = {}


def listen_for_rendezvous(node_ip: str) -> int:
    """Rank 0: open the group's rendezvous port on `node_ip` (this node's address on the cluster network).

    torch's TCPStore server, given only a port, listens on every interface (`*:PORT`); handed a socket
    already bound to the node's address it listens there alone, so a local run stays on loopback.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((node_ip, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    _rendezvous_sockets[port] = sock
    return port


def set_rendezvous_env(rank: int, world_size: int, master_addr: str, master_port: int, node_ip: str) -> None:
    """torch.distributed's rendezvous at rank 0's node (`master_addr`); this rank's node address is `node_ip`.

    gloo's pair sockets and NCCL's bootstrap sockets use the interface that holds `node_ip` (lo on a
    local run) unless the environment the workers inherit from `ray start` already names one.
    """
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0")
    interface = interface_of(node_ip)
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)


def worker_device(device: str) -> torch.device:
    """The plan's trainer.device as this process's torch device.

    On GPU, Ray hands each worker its GPU through CUDA_VISIBLE_DEVICES, so it is always cuda:0 here.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.device=cuda, but this worker process sees no CUDA device "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def join_process_group(device: torch.device, rank: int, world_size: int) -> None:
    """Join the group (blocks until every rank has called it): NCCL between GPUs, gloo between CPU processes.

    Meets at MASTER_ADDR:MASTER_PORT (set_rendezvous_env); rank 0 serves the store on the socket that
    listen_for_rendezvous opened, when this process opened one.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    port = int(os.environ["MASTER_PORT"])
    listening = _rendezvous_sockets.pop(port, None) if rank == 0 else None
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], port, world_size, is_master=rank == 0,
                              timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S),
                              master_listen_fd=listening.fileno() if listening is not None else None)
    finally:
        if listening is not None:
            # The store's server closes the descriptor when the group goes. Closing it again from this
            # socket object (when it is collected, at the latest at exit) would close whatever reused the
            # number by then: measured, gloo's epoll descriptor of a later group, whose thread then
            # aborts the process (tests/engine/test_rendezvous_fd.py).
            listening.detach()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def join_role_group(device: torch.device, role: str, rank: int, world_size: int) -> None:
    """A role with a worker group of its own (critic, reward model): join its process group, or share the one
    this process is already in when that has the same size. That happens only in-process (LocalWorkerGroup
    runs the actor's one-rank worker in this process too; one rank has nothing to keep apart)."""
    if not dist.is_initialized():
        join_process_group(device, rank, world_size)
    elif dist.get_world_size() != world_size:
        raise RuntimeError(f"{role} rank {rank}: this process is already in a process group of "
                           f"{dist.get_world_size()} ranks, the {role.replace('_', ' ')} needs {world_size}")


def to_device(batch: TensorBatch, device: torch.device) -> TensorBatch:
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def to_cpu(batch: TensorBatch) -> TensorBatch:
    return {name: tensor.cpu() for name, tensor in batch.items()}
