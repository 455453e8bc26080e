"""Layer weights placed on tiers at layer granularity, loaded on demand for the compute device, with the next
layer prefetched by a background thread while the current one computes.

A layer whose weights live away from the GPU it computes on is copied into one of a few reused staging buffer
sets there (the layer computing, the layer being prefetched), from pinned host memory, on the `weights` side
stream; the compute stream waits for that copy's event, and a staging set is refilled only after the compute
stream has passed the event recorded when its previous layer was handed back."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.checkpoint import CheckpointReader, LayerWeights
from engine.compression.qlinear import kernel_layout_bytes
from engine.kernels.native import NativeKernels
from engine.memory.checkpoint_layers import LayerPlan, checkpoint_plans, file_plan, read_layer
from engine.memory.converted import encode_layer, keep_layer, layer_folder, layer_identity, read_kept
from engine.memory.disk_read import DirectReader, memory_room_bytes, reads_direct
from engine.memory.expert_reads import StreamedExperts, split_experts, streams_experts
from engine.memory.heap import release_freed_memory
from engine.memory.offload import layer_path, stored_layer, write_layer
from engine.memory.tiers import Devices, tensor_bytes
from engine.policy import Policy
from engine.quantized.mxfp4_layer import keeps_packed
from engine.quantized.repack import repacked_layer

log = logging.getLogger(__name__)


def layer_tiers(num_layers: int, fractions: dict[str, float]) -> list[str]:
    """Assign each layer a tier so that each tier gets round(fraction * layers) layers, spread evenly (a disk
    layer between resident ones gives its read time to overlap with their compute)."""
    return _spread(num_layers, _tier_counts(num_layers, fractions))


def _tier_counts(num_layers: int, fractions: dict[str, float]) -> dict[str, int]:
    counts, acc = {}, 0.0
    for name in ("gpu", "cpu", "disk"):
        start = round(acc * num_layers)
        acc += fractions[name]
        counts[name] = round(min(acc, 1.0) * num_layers) - start
    counts["disk"] = num_layers - counts["gpu"] - counts["cpu"]
    return counts


def _spread(n: int, counts: dict[str, int]) -> list[str]:
    out, given = [], dict.fromkeys(counts, 0)
    for i in range(n):
        name = max(counts, key=lambda t: (counts[t] * (i + 1) / n - given[t], -"gpu cpu disk".find(t)))
        out.append(name)
        given[name] += 1
    return out


def layer_ranges(layers: list[int]) -> str:
    """Sorted layer indices as runs: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def stored_layers(folder: Path | None, layers: list[int], identity: dict | None = None) -> dict[int, dict | None]:
    """`stored_layer` of each of `layers` in the offload folder (each recorded as that layer of `identity`),
    checked on every core at once: each check hashes its whole file, and hashlib lets other threads run
    meanwhile."""
    if folder is None or not layers:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(layers), os.cpu_count() or 1)) as pool:
        return dict(zip(layers, pool.map(lambda i: stored_layer(folder, i, identity), layers)))


def weight_placement(policy: Policy, num_layers: int) -> list[str]:
    """Each layer's weight tier under `policy`. The gpu tier's layers go first to the layers that compute on the
    GPU (in decode, then in prefill; upper layers first), so that a static CPU-GPU split keeps its GPU layers'
    weights resident there and its CPU layers' weights in CPU memory: only activations cross (FlexInfer). The
    cpu and disk layers are spread evenly over the rest. Without a split every layer is alike and the tiers are
    spread evenly over all of them (`layer_tiers`)."""
    fractions = {t: getattr(policy, f"weight_{t}") for t in ("gpu", "cpu", "disk")}
    affinity = [2 * policy.layer_on_gpu("decode", j) + policy.layer_on_gpu("prefill", j) for j in range(num_layers)]
    if len(set(affinity)) == 1:
        return layer_tiers(num_layers, fractions)
    counts = _tier_counts(num_layers, fractions)
    by_affinity = sorted(range(num_layers), key=lambda j: (affinity[j], j), reverse=True)
    on_gpu = set(by_affinity[: counts["gpu"]])
    rest = [j for j in range(num_layers) if j not in on_gpu]
    spread = iter(_spread(len(rest), {"cpu": counts["cpu"], "disk": counts["disk"]}))
    return ["gpu" if j in on_gpu else next(spread) for j in range(num_layers)]


def globals_tier(policy: Policy, num_layers: int) -> str:
    """Where the embeddings, the final norm and the LM head live and compute, placed like a layer (as FlexGen
    does): on the gpu tier when decode's last layer computes on the GPU (the head then runs where the hidden
    states already are, every step), else in CPU memory. It depends on the compute devices only, never on solved
    fractions, so the engine and the planner place them alike."""
    return "gpu" if policy.layer_on_gpu("decode", num_layers - 1) else "cpu"


def head_in_int8(policy: Policy, where: str) -> bool:
    """Whether the LM head keeps its own row-wise int8 weight, computed with the int8 kernel (as CTranslate2's
    int8 keeps its output projection, and llama.cpp's 4-bit files keep theirs at 6 bits): with compressed weights
    (int8 or 4-bit), where the head computes on the CPU. In decode the head is a GEMM as large as several layers
    (vocabulary x hidden, per row), so a dense head there would outweigh the compressed layers it follows. A head
    on the GPU keeps the compute dtype."""
    return policy.compress_weight and policy.weight_format in ("int8", "int4") and where == "cpu"


class WeightStore:
    """Holds every layer on its tier: `gpu`/`cpu` layers in memory, `disk` layers read from the checkpoint's own
    files where the stored form is their bytes (engine/memory/checkpoint_layers.py), else as one safetensors file
    per layer in the offload folder (written once per model and format, then reused). The kernels decide how a
    loaded layer becomes ready to compute, and may keep a CPU layer that only computes on the CPU in their own
    packed form (accounted at its stored size).

    A mixture layer on disk, where every layer computes on the CPU, is read by expert (`streamed`): its trunk as
    a layer is, each expert once a token of the step chose it (engine/memory/expert_reads.py). There too, a gpt-oss
    checkpoint's MXFP4 experts are kept in their checkpoint form, on every tier (`packed_experts`:
    engine/quantized/mxfp4_layer.py).

    `weight_wait_s` is the time the computing thread waited for a layer or a routed expert (a prefetch not yet
    done, or a load of its own), `load_s` the time the prefetch thread spent loading: together they tell a run bound by the disk
    from one bound by compute."""

    def __init__(self, reader: CheckpointReader, policy: Policy, devices: Devices, dtype: torch.dtype,
                 codec=None, offload_dir: Path | None = None, kernels: NativeKernels | None = None):
        self.devices = devices
        self.dtype = dtype
        self.codec = codec  # compresses / decompresses a layer; None keeps weights as they are
        self.kernels = kernels or NativeKernels()
        self.placement = weight_placement(policy, reader.spec.num_layers)
        self._cpu_only = [not (policy.layer_on_gpu("prefill", i) or policy.layer_on_gpu("decode", i))
                          for i in range(reader.spec.num_layers)]
        self.resident: dict[int, LayerWeights] = {}
        self.meta: dict[int, dict[str, str] | None] = {}
        self._in_use: tuple | None = None  # the staging set and codec buffers of the layer computing
        self._staging_free: list[dict] = []
        self._released = None  # compute-stream event recorded when the last layer was handed back
        self.files: dict[int, Path] = {}
        self.layer_bytes: list[int] = []
        self.weight_wait_s = 0.0
        self.load_s = 0.0
        # one intra-op thread for the prefetcher: with two, its dequant/copies fight the compute thread's
        # OpenMP team for the same cores and slow every op on the main thread
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexbatch-prefetch",
                                        initializer=torch.set_num_threads, initargs=(1,))
        self._pending: dict[tuple[int, str], Future] = {}
        self._as_kept: dict[tuple[int, str], bool] = {}  # (layer, device): ready as kept, so not prefetched
        on_disk = [i for i, tier in enumerate(self.placement) if tier == "disk"]
        self.packed_experts = keeps_packed(reader.spec, policy)  # MXFP4 experts in their checkpoint form
        self.plans = checkpoint_plans(reader, on_disk, dtype, codec)  # read from the checkpoint: no offload copy
        # in the offload folder (engine/memory/converted.py): disk layers not read from the checkpoint, and every
        # compressed layer, converted once and read by later runs
        copies = [i for i, tier in enumerate(self.placement)
                  if i not in self.plans and (tier == "disk" or codec is not None)]
        self.identity = layer_identity(reader, dtype, codec, offload_dir, self.packed_experts) if copies else {}
        folder = layer_folder(self.identity, offload_dir) if copies else None
        room = memory_room_bytes()  # before the layers, as the planner measured it (planner.cost_model)
        kept = stored_layers(folder, copies, self.identity)
        for i, tier in enumerate(self.placement):
            if i in self.plans:
                self._place_read(i)
            else:
                self._place(reader, i, tier, folder, kept.get(i))
                if kept.get(i) is None:
                    release_freed_memory()  # the layer's full-precision copy, before the next is read
        disk = sum(n for n, t in zip(self.layer_bytes, self.placement) if t == "disk")
        self.direct = DirectReader() if disk and reads_direct(disk, room) else None  # else page-cached reads
        self._buffers = DirectReader()  # a checkpoint layer's buffers when reads go through the page cache
        # mixture layers on disk that compute on the CPU: the trunk read with the layer, each expert once routed
        spec, streams = reader.spec, streams_experts(reader.spec, policy)
        self.streamed = {i: split_experts(self.plans.get(i) or file_plan(self.files[i], self.meta[i]), spec.moe_prefix)
                         for i, tier in enumerate(self.placement) if streams and tier == "disk" and spec.moe_layers[i]}
        self._moe_prefix = spec.moe_prefix
        self._expert_buffers = DirectReader()
        # the routed experts' dense buffers, one set for every streamed layer: a layer's experts are handed back
        # before the next layer's are read
        self._expert_dense = codec.acquire() if codec is not None and self.streamed else None
        self._expert_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexbatch-experts",
                                               initializer=torch.set_num_threads, initargs=(1,))
        if disk:
            log.info("disk tier: %d MiB read %s%s", disk >> 20, "with O_DIRECT" if self.direct else "buffered",
                     f"; layers {layer_ranges(sorted(self.plans))} from the checkpoint's own files" if self.plans
                     else "")

    def _place_read(self, i: int) -> None:
        """Layer i stays in the checkpoint: only its accounts, at the bytes of its stored form."""
        plan = self.plans[i]
        self.meta[i] = plan.meta
        self.layer_bytes.append(plan.stored_bytes)
        self.devices.tiers["disk"].reserve(plan.stored_bytes, f"layer {i}")

    def _place(self, reader: CheckpointReader, i: int, tier: str, folder: Path | None, kept: dict | None) -> None:
        if kept is not None and tier == "disk":  # written by an earlier run and complete (engine/memory/offload.py)
            path = self.files[i] = layer_path(folder, i)
            self.meta[i] = kept or None
            self.layer_bytes.append(path.stat().st_size)
            self.devices.tiers["disk"].reserve(self.layer_bytes[-1], f"layer {i}")
            return
        if kept is not None:  # converted by an earlier run: read, not quantized again
            stored, self.meta[i] = read_kept(folder, i), kept or None
        else:
            stored, self.meta[i] = (repacked_layer(reader, i, self.codec)  # a GPTQ/AWQ layer's own 4-bit codes
                                    or encode_layer(reader, i, self.dtype, self.codec, self.packed_experts))
        nbytes = tensor_bytes(stored.values())
        self.layer_bytes.append(nbytes)
        self.devices.tiers[tier].reserve(nbytes, f"layer {i}")
        if tier == "disk":
            self.files[i] = write_layer(folder, i, stored, self.meta[i], self.identity)
        else:
            if kept is None and self.codec is not None:
                keep_layer(folder, i, stored, self.meta[i], self.identity)
            dev = self.devices.torch_device(tier)
            resident = {k: v.to(dev) for k, v in stored.items()}
            if tier == "cpu" and self._cpu_only[i]:
                resident = self.kernels.pack_resident(resident, self.meta[i], self.codec)
                if layout := kernel_layout_bytes(resident.values()):  # beside the codes the dense path reads
                    self.devices.tiers["cpu"].reserve(layout, f"layer {i} (int4 kernel layout)")
            elif tier == "cpu":  # crosses PCIe whenever it computes on the GPU
                resident = {k: self.devices.pinned(v) for k, v in resident.items()}
            self.resident[i] = resident

    def _load(self, i: int, device: str) -> tuple[LayerWeights, tuple]:
        """Layer i ready to compute on `device` (read from disk if needed, moved, then decompressed there), and
        the staging set and codec buffers it occupies until it is handed back."""
        tier, disk_buf = self.placement[i], None
        if i in self.streamed:
            return self._load_trunk(i)
        if tier == "disk" and i in self.plans:
            stored, disk_buf = self._read_plan(self.plans[i], self.direct or self._buffers)
            src = "cpu"
        elif tier == "disk" and self.direct is not None:
            (stored, buf), src = self.direct.read(self.files[i]), "cpu"
            disk_buf = self.direct, buf
            self.devices.links.add("disk", "cpu", self.layer_bytes[i])
        elif tier == "disk":
            stored, src = load_file(str(self.files[i])), "cpu"
            self.devices.links.add("disk", "cpu", self.layer_bytes[i])
        else:
            stored, src = self.resident[i], tier
        staging = None
        if src != device and device == "gpu":
            staging = self._staging_free.pop() if self._staging_free else {}
            moved = {k: self.devices.copy_into(self._slot(staging, k, v), v, src, device) for k, v in stored.items()}
        else:
            moved = {k: self.devices.move(v, src, device) for k, v in stored.items()}
        weights, buffers = self.kernels.ready(moved, self.meta[i], self.codec, device)
        return weights, (staging, buffers, disk_buf, None)

    def _load_trunk(self, i: int) -> tuple[StreamedExperts, tuple]:
        """Streamed mixture layer i ready on the CPU: its trunk read now, each expert once the router chose it
        (engine/memory/expert_reads.py); the trunk readied into the layer's codec buffers."""
        stored, disk_buf = self._read_plan(self.streamed[i][0], self.direct or self._buffers)
        weights, buffers = self.kernels.ready(stored, self.meta[i], self.codec, "cpu")
        layer = StreamedExperts(weights, self._moe_prefix, partial(self._read_expert, i), self._expert_pool)
        return layer, (None, buffers, disk_buf, layer)

    def _read_expert(self, i: int, e: int) -> tuple[LayerWeights, tuple]:
        """Expert e of streamed layer i, read (in the experts' reader thread) and readied (into the experts' own
        dense buffers); and its buffer."""
        with torch.inference_mode():
            stored, (pool, buf) = self._read_plan(self.streamed[i][1][e], self._expert_buffers)
            try:
                weights, _ = self.kernels.ready(stored, self.meta[i], self.codec, "cpu", self._expert_dense)
            except BaseException:
                pool.release(buf)
                raise
            return weights, (pool, buf)

    def _read_plan(self, plan: LayerPlan, pool: DirectReader) -> tuple[LayerWeights, tuple]:
        """The tensors `plan` reads from disk, views of a buffer from `pool`; and (pool, buffer), to release once
        they are unused."""
        buf = pool.buffer(plan.buffer_bytes)
        try:
            stored, nread = read_layer(plan, buf, direct=self.direct is not None)
        except BaseException:
            pool.release(buf)
            raise
        self.devices.links.add("disk", "cpu", nread)
        return stored, (pool, buf)

    def _slot(self, staging: dict, name: str, like: torch.Tensor) -> torch.Tensor:
        """The staging buffer for tensor `name` on the GPU, made on first use (every layer has the same shapes)."""
        buf = staging.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = staging[name] = torch.empty(like.shape, dtype=like.dtype, device=self.devices.torch_device("gpu"))
        return buf

    def prefetch(self, i: int, device: str) -> None:
        """Start readying layer i for `device` in the prefetch thread, unless it is kept on that device in a form
        ready as it is (`get` then wraps it on the compute thread: no reads, copies or decompression to hide)."""
        if 0 <= i < len(self.placement) and (i, device) not in self._pending and not self._ready_as_kept(i, device):
            self._pending[(i, device)] = self._pool.submit(self._load_in_thread, i, device, self._released)

    def _ready_as_kept(self, i: int, device: str) -> bool:
        key = (i, device)
        if key not in self._as_kept:
            self._as_kept[key] = self.placement[i] == device and self.kernels.ready_in_place(
                self.resident[i], self.meta[i], self.codec, device)
        return self._as_kept[key]

    def _load_in_thread(self, i: int, device: str, released):
        stream = self.devices.streams["weights"]
        with torch.inference_mode(), stream:  # inference mode is per thread; the buffers were made under it
            stream.wait(released)  # buffers handed back are refilled only once the compute stream is past them
            t0 = time.perf_counter()
            weights, held = self._load(i, device)
            self.load_s += time.perf_counter() - t0
            return weights, held, stream.record()

    def get(self, i: int, device: str) -> LayerWeights:
        """Layer i on `device`. The schedule computes one layer at a time, so this also hands the previous
        layer's staging and decompression buffers back for reuse."""
        future = self._pending.pop((i, device), None)
        t0 = time.perf_counter()
        if future is not None:
            weights, held, ready = future.result()
            self.devices.compute_stream.wait(ready)
        else:
            weights, held = self._load(i, device)
        self.weight_wait_s += time.perf_counter() - t0
        if self._in_use is not None:
            self._hand_back(self._in_use)
        self._in_use = held
        return weights

    def _hand_back(self, held: tuple) -> None:
        """A layer's staging set, decompression buffers and disk buffer, free for the next layer."""
        staging, buffers, disk_buf, streamed = held
        if streamed is not None:  # its expert reads end before their buffers and the codec's are reused
            self.weight_wait_s += streamed.waited_s
            for pool, buf in streamed.release():
                pool.release(buf)
        if disk_buf is not None:  # the layer's tensors were views of it
            pool, buf = disk_buf
            pool.release(buf)
        if staging is not None:
            self._staging_free.append(staging)
        if buffers is not None:
            self.codec.release(buffers)
        self._released = self.devices.compute_stream.record()

    def settle(self) -> None:
        """The end of a call: the read-ahead of a layer for a step that did not come is cancelled, or, where it
        had started, waited for; its buffers and the last layer's are handed back. Nothing reads a layer file
        once this returns (a process that rewrites such a file in place would otherwise meet a mapping still
        being read), and no layer is held between calls. The next call reads its first layer itself."""
        for (i, device), future in list(self._pending.items()):
            if future.cancel():
                continue
            try:
                _weights, held, _ready = future.result()
            except Exception as e:  # a layer no step asked for: its error is not this call's
                log.warning("reading layer %d ahead for %s failed: %s", i, device, e)
                continue
            self._hand_back(held)
        self._pending.clear()
        if self._in_use is not None:
            self._hand_back(self._in_use)
            self._in_use = None

    def staging_bytes(self) -> int:
        """GPU bytes the staging of two layers takes (0 when no layer moves to the GPU to compute)."""
        moves = any(t != "gpu" for j, t in enumerate(self.placement) if not self._cpu_only[j])
        return 2 * max(self.layer_bytes) if moves and self.devices.gpu_available else 0

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._expert_pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
