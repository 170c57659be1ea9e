"""A process tree and its listening TCP sockets, read from /proc (Linux; no psutil needed)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    ip: str
    port: int

    @property
    def on_loopback(self) -> bool:
        address = ipaddress.ip_address(self.ip)
        mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback seen by an IPv6 socket
        return (mapped or address).is_loopback


def process_tree(root: int) -> set[int]:
    """`root` and every process below it (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    # Listed, then read each in a try: a glob stats what it lists, and a process that ends in between raises
    # ProcessLookupError there (ESRCH, not among the errors pathlib's glob ignores; a CI run failed so, 2026-11-28).
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we read
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


def stop_signals_blocked(pid: int) -> bool:
    """Whether SIGINT and SIGTERM are both in the process's blocked mask (/proc/<pid>/status SigBlk): a child the
    launch forks holds them blocked until it has left the launch's process group (engine.launch)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                mask = int(line.split()[1], 16)
                return all(mask & (1 << (signum - 1)) for signum in (signal.SIGINT, signal.SIGTERM))
    except OSError:
        pass
    return False


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _address(hex_ip: str) -> str:
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) order.
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets(pids: set[int]) -> list[Listener]:
    """The TCP sockets in LISTEN state that the processes `pids` hold."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == "0A" and inode in owner:  # 0A: TCP_LISTEN
                hex_ip, hex_port = local.split(":")
                found.append(Listener(owner[inode], command_of(owner[inode]), _address(hex_ip), int(hex_port, 16)))
    return found
