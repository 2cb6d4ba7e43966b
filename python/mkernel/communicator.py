"""Communicators: one rank of a group of GPUs that run mkernel's fused ops together.

A :class:`Communicator` wraps one libmkernel communicator (a session with the node's mkerneld,
its buffers and flags, the NVLink workspace the fused ops use) together with the plans made on
it. It is made collectively, by every rank of the group:

* :meth:`Communicator.from_process_group`: from a ``torch.distributed`` process group. Rank 0
  asks its mkerneld for a unique id; the group's store carries it to the other ranks.
* :meth:`Communicator.from_env`: from the launcher's environment (``torchrun``'s ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) plus ``MKERNEL_TOKEN``, as the
  C++ ``Communicator::create_from_env`` does.

Its size is fixed at creation: ``workspace_bytes`` must hold the gathered activation of the
largest AllGather+GEMM it will run (:func:`all_gather_matmul_workspace_bytes`). Plans, one per
shape, are made on a shape's first call (collectively, so every rank must call with the same
shape) and live with the communicator until :meth:`Communicator.close`.

The torch ops find a communicator by the ``group_name`` they are given: communicators register
under their group's name (``from_process_group``) or under ``name`` (``from_env``). Where none is
registered, the op makes one from the process group of that name, sized for the call.
"""

from __future__ import annotations

import atexit
import datetime
import os
import threading
from typing import Any

from . import _native
from ._errors import ArgumentError, MkernelError

_registry: dict[str, "Communicator"] = {}
_registry_lock = threading.Lock()
# How many communicators this process has made per group: every rank makes them in the same
# order, so the count names the store key of each one's unique id.
_made_per_group: dict[str, int] = {}


def all_gather_matmul_workspace_bytes(world: int, m_local: int, k: int) -> int:
    """NVLink workspace bytes an AllGather+GEMM over ``world`` ranks of A shards [m_local, k] needs."""
    return int(_native.require().all_gather_gemm_nvlink_bytes(world, m_local, k))


def all_gather_matmul_network_bytes(nodes: int, m_local: int, k: int) -> int:
    """Network workspace bytes the same op needs between ``nodes`` nodes (0 on one node)."""
    return int(_native.require().all_gather_gemm_network_bytes(nodes, m_local, k))


def _seconds(value: float | datetime.timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    if not seconds > 0:
        raise ArgumentError(f"{name}: {value!r}; expected a positive time in seconds")
    return seconds


def _byte_count(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(f"{name}: {value!r}; expected an integer number of bytes >= {minimum}")
    return value


def _default_network_bytes(workspace_bytes: int, size: int) -> int:
    """The network workspace where the ranks may span nodes: torchrun says so through
    LOCAL_WORLD_SIZE; each node's shard needs at most what the whole gathered A needs."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and 0 < int(local) < size:
        return workspace_bytes
    return 0


def _native_options(
    *,
    device: int,
    workspace_bytes: int,
    network_workspace_bytes: int,
    socket_path: str | None,
    rendezvous_timeout: float,
    device_wait_timeout: float,
    gpu_memory: str,
) -> dict[str, Any]:
    if gpu_memory not in ("auto", "require", "off"):
        raise ArgumentError(f"gpu_memory: {gpu_memory!r}; expected 'auto', 'require' or 'off'")
    return dict(
        device=device,
        nvlink_bytes=workspace_bytes,
        network_workspace_bytes=network_workspace_bytes,
        socket_path=socket_path or "",
        rendezvous_timeout_ms=max(1, int(rendezvous_timeout * 1000)),
        device_wait_timeout_ms=max(1, int(device_wait_timeout * 1000)),
        gpu_memory=gpu_memory,
    )


class Communicator:
    """One rank of an mkernel communicator (see the module's documentation).

    Use :meth:`from_process_group` or :meth:`from_env` to make one.
    """

    def __init__(self, native_comm: Any, name: str) -> None:
        self._native = native_comm
        self.name = name

    # ---- creation -------------------------------------------------------------------------------

    @classmethod
    def from_process_group(
        cls,
        group: Any = None,
        *,
        workspace_bytes: int,
        network_workspace_bytes: int | None = None,
        device: int | None = None,
        socket_path: str | None = None,
        rendezvous_timeout: float | datetime.timedelta = 60.0,
        device_wait_timeout: float | datetime.timedelta = 2.0,
        gpu_memory: str = "auto",
        register: bool = True,
    ) -> "Communicator":
        """Makes this rank's communicator for a ``torch.distributed`` process group (collective).

        Every rank of ``group`` (default: the world) calls it with the same sizes. Rank 0 asks
        its mkerneld (``socket_path``, else ``MKERNEL_SOCKET``, else /run/mkerneld/mkerneld.sock)
        for a unique id and puts it in the group's store; the others wait for it there, up to
        ``rendezvous_timeout`` seconds, which also bounds the ranks joining. ``device`` is the
        rank's CUDA device (default: torch's current one).
        """
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        native = _native.require()
        if not dist.is_available() or not dist.is_initialized():
            raise ArgumentError(
                "group: torch.distributed is not initialized; call torch.distributed.init_process_group "
                "first, or use Communicator.from_env"
            )
        group = group if group is not None else dist.group.WORLD
        group_name = group.group_name
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ArgumentError(f"group: this process (global rank {dist.get_rank()}) is not in group {group_name!r}")
        workspace_bytes = _byte_count(workspace_bytes, "workspace_bytes", 1)
        if network_workspace_bytes is None:
            network_workspace_bytes = _default_network_bytes(workspace_bytes, size)
        network_workspace_bytes = _byte_count(network_workspace_bytes, "network_workspace_bytes")
        timeout = _seconds(rendezvous_timeout, "rendezvous_timeout")
        options = _native_options(
            device=torch.cuda.current_device() if device is None else int(device),
            workspace_bytes=workspace_bytes,
            network_workspace_bytes=network_workspace_bytes,
            socket_path=socket_path,
            rendezvous_timeout=timeout,
            device_wait_timeout=_seconds(device_wait_timeout, "device_wait_timeout"),
            gpu_memory=gpu_memory,
        )

        with _registry_lock:
            seq = _made_per_group.get(group_name, 0)
            _made_per_group[group_name] = seq + 1
        key = f"mkernel/{group_name}/{seq}/unique_id"
        store = c10d._get_process_group_store(group)
        if rank == 0:
            try:
                unique_id = native.get_unique_id(options["socket_path"], options["device"])
            except MkernelError as e:
                # The other ranks learn at once why no id comes, instead of at their timeout.
                store.set(key, "error:" + str(e))
                raise
            store.set(key, unique_id)
        else:
            try:
                store.wait([key], datetime.timedelta(seconds=timeout))
            except Exception as e:  # the store's own timeout error; its type differs by version
                raise MkernelError(
                    f"group {group_name!r}: rank 0 did not publish mkernel's unique id within {timeout:g} s "
                    f"(store key {key!r}): {e}",
                    "deadline exceeded",
                ) from e
            unique_id = store.get(key).decode()
            if unique_id.startswith("error:"):
                raise MkernelError(f"group {group_name!r}: rank 0 could not make the unique id: {unique_id[6:]}")
        comm = cls(native.Communicator.create(rank, size, unique_id, **options), group_name)
        if register:
            comm.register(group_name)
        return comm

    @classmethod
    def from_env(
        cls,
        *,
        workspace_bytes: int,
        network_workspace_bytes: int | None = None,
        device: int | None = None,
        socket_path: str | None = None,
        rendezvous_timeout: float | datetime.timedelta = 60.0,
        device_wait_timeout: float | datetime.timedelta = 2.0,
        gpu_memory: str = "auto",
        name: str | None = None,
        register: bool = True,
    ) -> "Communicator":
        """Makes this rank's communicator from the launcher's environment (collective).

        Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (the CUDA device unless ``device`` is
        given), ``MASTER_ADDR`` and ``MASTER_PORT`` (they name the communicator),
        ``MKERNEL_TOKEN`` (the shared secret, 16 to 256 bytes) and ``MKERNEL_PEER_PORT`` (the
        root daemon's peer port on MASTER_ADDR, default 7100). A missing or malformed variable
        is an error naming it. Registered under ``name``: by default the name of
        torch.distributed's world group when it is initialized (so ops given that group's name
        use it), else ``"env"``.
        """
        native = _native.require()
        workspace_bytes = _byte_count(workspace_bytes, "workspace_bytes", 1)
        size = int(os.environ["WORLD_SIZE"]) if os.environ.get("WORLD_SIZE", "").isdigit() else 1
        if network_workspace_bytes is None:
            network_workspace_bytes = _default_network_bytes(workspace_bytes, size)
        network_workspace_bytes = _byte_count(network_workspace_bytes, "network_workspace_bytes")
        options = _native_options(
            device=-1 if device is None else int(device),
            workspace_bytes=workspace_bytes,
            network_workspace_bytes=network_workspace_bytes,
            socket_path=socket_path,
            rendezvous_timeout=_seconds(rendezvous_timeout, "rendezvous_timeout"),
            device_wait_timeout=_seconds(device_wait_timeout, "device_wait_timeout"),
            gpu_memory=gpu_memory,
        )
        if name is None:
            name = _world_group_name() or "env"
        comm = cls(native.Communicator.create_from_env(**options), name)
        if register:
            comm.register(name)
        return comm

    # ---- use ------------------------------------------------------------------------------------

    def register(self, name: str) -> None:
        """Makes the ops given ``group_name=name`` use this communicator."""
        with _registry_lock:
            _registry[name] = self

    def plan(self, m_local: int, n_local: int, k: int, stream: int | None = None) -> None:
        """Plans an AllGather+GEMM shape now, e.g. before a CUDA graph capture (collective)."""
        self._live().plan(m_local, n_local, k, _stream_or_current(stream, self.device))

    def has_plan(self, m_local: int, n_local: int, k: int) -> bool:
        return bool(self._live().has_plan(m_local, n_local, k))

    def describe(self, m_local: int, n_local: int, k: int) -> str:
        """The plan of a shape in words (layout, chunks, blocks, GEMM configuration)."""
        return str(self._live().describe(m_local, n_local, k))

    def check(self) -> None:
        """Raises MkernelError if a launch failed on the GPU (a dead peer, a wait past its bound,
        the daemon gone), naming rank, launch, step and cause. Does not block: synchronise the
        stream first to see the launches before it."""
        self._live().check()

    def close(self) -> None:
        """Frees the plans and the communicator's buffers and leaves the daemon's session."""
        with _registry_lock:
            for key in [k for k, v in _registry.items() if v is self]:
                del _registry[key]
        if not self._native.closed:
            self._native.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Any:
        if self._native.closed:
            raise MkernelError(f"communicator {self.name!r} was closed; make a new one", "failed precondition")
        return self._native

    @property
    def native(self) -> Any:
        """The compiled module's communicator (mkernel._C.Communicator)."""
        return self._live()

    @property
    def closed(self) -> bool:
        return bool(self._native.closed)

    @property
    def rank(self) -> int:
        return int(self._native.rank)

    @property
    def size(self) -> int:
        return int(self._native.size)

    @property
    def device(self) -> int:
        return int(self._native.device)

    @property
    def nodes(self) -> int:
        return int(self._native.nodes)

    @property
    def workspace_bytes(self) -> int:
        return int(self._native.nvlink_bytes)

    @property
    def network_workspace_bytes(self) -> int:
        return int(self._native.network_workspace_bytes)

    @property
    def staging(self) -> str:
        return str(self._native.staging)

    @property
    def staging_reason(self) -> str:
        return str(self._native.staging_reason)

    @property
    def transport(self) -> str:
        return str(self._native.transport)

    def __repr__(self) -> str:
        if self.closed:
            return f"<mkernel.Communicator {self.name!r} closed>"
        return (
            f"<mkernel.Communicator {self.name!r} rank {self.rank} of {self.size} on cuda:{self.device}, "
            f"{self.nodes} node(s), workspace {self.workspace_bytes} B>"
        )


def get_communicator(group_name: str) -> Communicator | None:
    """The communicator registered under ``group_name``, or None."""
    with _registry_lock:
        comm = _registry.get(group_name)
    return comm if comm is not None and not comm.closed else None


def _world_group_name() -> str:
    try:
        import torch.distributed as dist
    except ImportError:
        return ""
    if dist.is_available() and dist.is_initialized():
        return str(dist.group.WORLD.group_name)
    return ""


def _stream_or_current(stream: int | None, device: int) -> int:
    if stream is not None:
        return int(stream)
    try:
        import torch
    except ImportError:
        return 0  # the legacy default stream
    return int(torch.cuda.current_stream(device).cuda_stream)


@atexit.register
def _close_all() -> None:
    # Communicators still registered at exit leave their daemon sessions in order rather than
    # by the daemon noticing a dead process.
    with _registry_lock:
        comms = list({id(c): c for c in _registry.values()}.values())
    for comm in comms:
        try:
            comm.close()
        except Exception:  # exit goes on whatever one communicator says
            pass
