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
largest AllGather+GEMM it will run (:func:`all_gather_matmul_workspace_bytes`) and the staged
partial tiles of the largest GEMM+ReduceScatter (:func:`matmul_reduce_scatter_workspace_bytes`)
and GEMM+AllReduce (:func:`matmul_all_reduce_workspace_bytes`), whichever is larger (the ops take
turns with it), and what the MoE and ring attention need (:func:`moe_workspace_bytes`,
:func:`ring_attention_workspace_bytes`); a GEMM+ReduceScatter or GEMM+AllReduce of many tiles or a
large MoE may also need more fused-op flags than libmkernel's default (``fused_flags``,
:func:`matmul_reduce_scatter_fused_flags`, :func:`matmul_all_reduce_fused_flags`,
:func:`moe_fused_flags`). Plans, one per op and shape, are made on a shape's first call
(collectively, so every rank must call with the same shape) and live with the communicator until
:meth:`Communicator.close`.

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


def matmul_reduce_scatter_workspace_bytes(world: int, m_local: int, n: int, nodes: int = 1) -> int:
    """NVLink workspace bytes a GEMM+ReduceScatter over ``world`` ranks on ``nodes`` nodes needs for
    a result of [m_local, n] per rank (the node peers' partial tiles; 0 with one GPU per node),
    for whichever tile width the engine picks."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().gemm_reduce_scatter_nvlink_bytes(nodes, gpus, m_local, n))


def matmul_reduce_scatter_network_bytes(nodes: int, m_local: int, n: int) -> int:
    """Network workspace bytes the same op needs between ``nodes`` nodes (0 on one node)."""
    return int(_native.require().gemm_reduce_scatter_network_bytes(nodes, m_local, n))


def matmul_reduce_scatter_fused_flags(world: int, m_local: int, n: int, nodes: int = 1) -> int:
    """Fused-op flags (``fused_flags`` of a communicator) the same op needs, for whichever tile
    width the engine picks: one per staged tile, so it grows with m_local x n; libmkernel's
    default is ``default_fused_flags()``."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().gemm_reduce_scatter_fused_flags(nodes, gpus, m_local, n))


def matmul_all_reduce_workspace_bytes(world: int, m: int, n: int, nodes: int = 1) -> int:
    """NVLink workspace bytes a GEMM+AllReduce over ``world`` ranks on ``nodes`` nodes needs for a
    result of [m, n] on every rank (m all the rows: the node peers' partial tiles and the finished
    tiles passed on to them; 0 with one GPU per node), for whichever tile width the engine picks."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().gemm_all_reduce_nvlink_bytes(nodes, gpus, m, n))


def matmul_all_reduce_network_bytes(nodes: int, m: int, n: int) -> int:
    """Network workspace bytes the same op needs between ``nodes`` nodes (0 on one node)."""
    return int(_native.require().gemm_all_reduce_network_bytes(nodes, m, n))


def matmul_all_reduce_fused_flags(world: int, m: int, n: int, nodes: int = 1) -> int:
    """Fused-op flags (``fused_flags`` of a communicator) the same op needs, for whichever tile
    width the engine picks: one per staged tile and per finished tile passed on, so it grows with
    m x n; libmkernel's default is ``default_fused_flags()``."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().gemm_all_reduce_fused_flags(nodes, gpus, m, n))


def moe_workspace_bytes(
    world: int,
    num_tokens: int,
    hidden: int,
    num_experts: int,
    top_k: int,
    *,
    out_hidden: int | None = None,
    nodes: int = 1,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
) -> int:
    """NVLink workspace bytes an MoE (moe_dispatch/moe_combine or moe_forward) over ``world``
    ranks on ``nodes`` nodes needs: every rank's token regions and the partial rows returned to it,
    for ``num_tokens`` tokens per rank (libmkernel's ``moe_nvlink_bytes``)."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().moe_nvlink_bytes(
        nodes, gpus, num_tokens, hidden, out_hidden or hidden, num_experts, top_k, recv_tokens_per_source or 0,
        expert_rows_capacity or 0))


def moe_network_bytes(
    world: int,
    num_tokens: int,
    hidden: int,
    num_experts: int,
    top_k: int,
    *,
    out_hidden: int | None = None,
    nodes: int = 1,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
) -> int:
    """Network workspace bytes the same MoE needs between nodes (0 on one node)."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().moe_network_bytes(
        nodes, gpus, num_tokens, hidden, out_hidden or hidden, num_experts, top_k, recv_tokens_per_source or 0,
        expert_rows_capacity or 0))


def moe_fused_flags(
    world: int,
    num_tokens: int,
    num_experts: int,
    top_k: int,
    *,
    nodes: int = 1,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
) -> int:
    """Fused-op flags (``fused_flags`` of a communicator) the same MoE needs."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().moe_fused_flags(
        nodes, gpus, num_tokens, num_experts, top_k, recv_tokens_per_source or 0, expert_rows_capacity or 0))


def ring_attention_workspace_bytes(
    world: int, batch: int, heads_q: int, heads_kv: int, s_local: int, head_dim: int, *, nodes: int = 1
) -> int:
    """NVLink workspace bytes a ring attention over ``world`` ranks needs: the K/V chunks a rank
    holds at once (libmkernel's ``ring_attention_nvlink_bytes``; 0 with one rank)."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().ring_attention_nvlink_bytes(nodes, gpus, batch, heads_q, heads_kv, s_local, head_dim))


def ring_attention_network_bytes(nodes: int, batch: int, heads_kv: int, s_local: int, head_dim: int) -> int:
    """Network workspace bytes the same ring needs between ``nodes`` nodes (0 on one node)."""
    return int(_native.require().ring_attention_network_bytes(nodes, batch, heads_kv, s_local, head_dim))


def ring_attention_fused_flags(world: int, nodes: int = 1) -> int:
    """Fused-op flags a ring attention over ``world`` ranks on ``nodes`` nodes needs (3 per rank
    on a node, more across nodes: within libmkernel's default)."""
    nodes, gpus = _nodes_and_gpus(world, nodes)
    return int(_native.require().ring_attention_fused_flags(nodes, gpus))


def default_fused_flags() -> int:
    """libmkernel's default number of fused-op flags (Options::fused_flags)."""
    return int(_native.require().default_fused_flags())


def _nodes_and_gpus(world: int, nodes: int) -> tuple[int, int]:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ArgumentError(f"world: {world!r}; expected a positive int")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or world % nodes != 0:
        raise ArgumentError(f"nodes: {nodes!r}; expected a positive divisor of world = {world} (as many GPUs on every node)")
    return nodes, world // nodes


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
    fused_flags: int | None,
    adaptive_split: bool = False,
) -> dict[str, Any]:
    if not isinstance(adaptive_split, bool):
        raise ArgumentError(f"adaptive_split: {adaptive_split!r}; expected True or False")
    if gpu_memory not in ("auto", "require", "off"):
        raise ArgumentError(f"gpu_memory: {gpu_memory!r}; expected 'auto', 'require' or 'off'")
    if fused_flags is not None and (
        isinstance(fused_flags, bool) or not isinstance(fused_flags, int) or not 1 <= fused_flags < 1 << 31
    ):
        raise ArgumentError(f"fused_flags: {fused_flags!r}; expected None (libmkernel's default) or a positive int")
    return dict(
        fused_flags=fused_flags or 0,
        device=device,
        nvlink_bytes=workspace_bytes,
        network_workspace_bytes=network_workspace_bytes,
        socket_path=socket_path or "",
        rendezvous_timeout_ms=max(1, int(rendezvous_timeout * 1000)),
        device_wait_timeout_ms=max(1, int(device_wait_timeout * 1000)),
        gpu_memory=gpu_memory,
        adaptive_split=adaptive_split,
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
        fused_flags: int | None = None,
        adaptive_split: bool = False,
        register: bool = True,
    ) -> "Communicator":
        """Makes this rank's communicator for a ``torch.distributed`` process group (collective).

        Every rank of ``group`` (default: the world) calls it with the same sizes. Rank 0 asks
        its mkerneld (``socket_path``, else ``MKERNEL_SOCKET``, else /run/mkerneld/mkerneld.sock)
        for a unique id and puts it in the group's store; the others wait for it there, up to
        ``rendezvous_timeout`` seconds, which also bounds the ranks joining. ``device`` is the
        rank's CUDA device (default: torch's current one). ``fused_flags`` (default: libmkernel's,
        :func:`default_fused_flags`) bounds the tiles a GEMM+ReduceScatter or GEMM+AllReduce may
        stage (:func:`matmul_reduce_scatter_fused_flags`, :func:`matmul_all_reduce_fused_flags`).
        ``adaptive_split`` lets the fused kernels move the split of their blocks between compute
        and communication from launch to launch (AllGather+GEMM, ring attention, fused MoE;
        results unchanged; :meth:`split_report`).
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
            fused_flags=fused_flags,
            adaptive_split=adaptive_split,
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
        fused_flags: int | None = None,
        adaptive_split: bool = False,
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
            fused_flags=fused_flags,
            adaptive_split=adaptive_split,
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

    def plan_matmul_reduce_scatter(self, m_local: int, n: int, k: int, stream: int | None = None) -> None:
        """Plans a GEMM+ReduceScatter shape now (result [m_local, n] per rank, k the reduction
        dimension each rank holds), e.g. before a CUDA graph capture (collective)."""
        self._live().plan_reduce_scatter(m_local, n, k, _stream_or_current(stream, self.device))

    def has_matmul_reduce_scatter_plan(self, m_local: int, n: int, k: int) -> bool:
        return bool(self._live().has_reduce_scatter_plan(m_local, n, k))

    def describe_matmul_reduce_scatter(self, m_local: int, n: int, k: int) -> str:
        """A GEMM+ReduceScatter plan in words (bands, order of tiles, GEMM configuration)."""
        return str(self._live().describe_reduce_scatter(m_local, n, k))

    def plan_matmul_all_reduce(self, m: int, n: int, k: int, stream: int | None = None) -> None:
        """Plans a GEMM+AllReduce shape now (result [m, n] on every rank, m all the rows, k the
        reduction dimension each rank holds), e.g. before a CUDA graph capture (collective)."""
        self._live().plan_all_reduce(m, n, k, _stream_or_current(stream, self.device))

    def has_matmul_all_reduce_plan(self, m: int, n: int, k: int) -> bool:
        return bool(self._live().has_all_reduce_plan(m, n, k))

    def describe_matmul_all_reduce(self, m: int, n: int, k: int) -> str:
        """A GEMM+AllReduce plan in words (bands, order of tiles, GEMM configuration)."""
        return str(self._live().describe_all_reduce(m, n, k))

    def has_plan(self, m_local: int, n_local: int, k: int) -> bool:
        return bool(self._live().has_plan(m_local, n_local, k))

    def describe(self, m_local: int, n_local: int, k: int) -> str:
        """The plan of a shape in words (layout, chunks, blocks, GEMM configuration)."""
        return str(self._live().describe(m_local, n_local, k))

    def plan_moe(
        self,
        num_tokens: int,
        hidden: int,
        num_experts: int,
        top_k: int,
        *,
        out_hidden: int | None = None,
        recv_tokens_per_source: int | None = None,
        expert_rows_capacity: int | None = None,
        apply_scores: bool = True,
        fused: bool = False,
        stream: int | None = None,
    ) -> None:
        """Plans an MoE shape now (moe_dispatch/moe_combine, or moe_forward with ``fused=True``,
        whose out_hidden is w's), e.g. before a CUDA graph capture (collective)."""
        self._live().plan_moe(num_tokens, hidden, out_hidden or hidden, num_experts, top_k,
                              recv_tokens_per_source or 0, expert_rows_capacity or 0, apply_scores, fused,
                              _stream_or_current(stream, self.device))

    def describe_moe(
        self,
        num_tokens: int,
        hidden: int,
        num_experts: int,
        top_k: int,
        *,
        out_hidden: int | None = None,
        recv_tokens_per_source: int | None = None,
        expert_rows_capacity: int | None = None,
        apply_scores: bool = True,
        fused: bool = False,
    ) -> str:
        """An MoE plan in words (regions, capacities, chunks, blocks)."""
        return str(self._live().describe_moe(num_tokens, hidden, out_hidden or hidden, num_experts, top_k,
                                             recv_tokens_per_source or 0, expert_rows_capacity or 0, apply_scores,
                                             fused))

    def plan_ring_attention(
        self,
        batch: int,
        heads_q: int,
        heads_kv: int,
        s_local: int,
        head_dim: int,
        *,
        causal: bool = False,
        layout: str = "bhsd",
        placement: str = "zigzag",
        scale: float | None = None,
        stream: int | None = None,
    ) -> None:
        """Plans a ring attention shape now, e.g. before a CUDA graph capture (collective)."""
        self._live().plan_ring_attention(batch, heads_q, heads_kv, s_local, head_dim, layout,
                                         _ring_placement(causal, placement), scale or 0.0,
                                         _stream_or_current(stream, self.device))

    def describe_ring_attention(
        self,
        batch: int,
        heads_q: int,
        heads_kv: int,
        s_local: int,
        head_dim: int,
        *,
        causal: bool = False,
        layout: str = "bhsd",
        placement: str = "zigzag",
        scale: float | None = None,
    ) -> str:
        """A ring attention plan in words (steps, slots, blocks)."""
        return str(self._live().describe_ring_attention(batch, heads_q, heads_kv, s_local, head_dim, layout,
                                                        _ring_placement(causal, placement), scale or 0.0))

    def check(self) -> None:
        """Raises MkernelError if a launch failed on the GPU (a dead peer, a wait past its bound,
        the daemon gone), naming rank, launch, step and cause. Does not block: synchronise the
        stream first to see the launches before it."""
        self._live().check()

    def split_report(self) -> str:
        """Where every plan's adaptive split stands (made with ``adaptive_split=True``), a line
        each: the op and shape, settled or exploring, the communication blocks of the next and
        last launch, every candidate count's average launch time. Empty without adaptive_split.
        Reads device memory: synchronise the stream first."""
        return self._live().split_report()

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
    def fused_flags(self) -> int:
        return int(self._native.fused_flags)

    @property
    def gpus_per_node(self) -> int:
        return self.size // max(1, self.nodes)

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


def _ring_placement(causal: bool, placement: str) -> str:
    if placement not in ("zigzag", "contiguous"):
        raise ArgumentError(f"placement: {placement!r}; expected 'zigzag' or 'contiguous'")
    return f"causal_{placement}" if causal else "non_causal"


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
