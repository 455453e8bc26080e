"""Where a job's engines run on Ray: connecting (or starting a local Ray), and one actor per engine placed by the
cluster's nodes: one per GPU with `num_gpus=1` and that GPU's share of the node's CPUs, or on a CPU-only node
one per node (or `--workers N` spread over the CPU nodes)."""

from __future__ import annotations

import logging
import os
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorSpec:
    """One engine: the node it is placed on, its CPUs (torch threads) and GPUs, and how many engines that node
    holds (they share its memory: each plans within its share)."""

    node_id: str
    node_ip: str
    num_cpus: int
    num_gpus: int
    node_engines: int = 1


def connect(address: str | None) -> tuple[str, bool]:
    """Join the cluster at `address` (or RAY_ADDRESS); with neither, start a Ray for this job only, with token
    authentication on (its token file private to its owner: `secure_token_file`), every port on 127.0.0.1 (its
    metrics endpoints answer without authentication), and a watchdog that stops it if this process is killed.
    Returns a description of where the job runs, and whether this call joined or started it (and should leave
    it)."""
    import ray

    if ray.is_initialized():
        return "the Ray this process already joined", False
    target = address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every worker's shard lines, not "repeated 2x"
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        log.warning("RAY_AUTH_MODE=disabled: anyone who reaches this cluster's ports can run code on it")
    else:
        secure_token_file(create=not target)
    try:
        if target:
            ray.init(address=target, logging_level=logging.WARNING, log_to_driver=True)
            return f"the Ray cluster at {target}", True
        _on_loopback(ray)
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    except ConnectionError as e:
        raise ConfigError(f"cannot join the Ray cluster at {target!r} ({e}); check --address / RAY_ADDRESS, and "
                          f"for token auth RAY_AUTH_MODE=token with the head's token in ~/.ray/auth_token") from e
    _watch_local_ray()
    return "a local Ray started for this job", True


def _on_loopback(ray) -> None:
    """Make the local Ray take 127.0.0.1 as its node address, as Ray does for a single machine on macOS: every
    Ray process then binds its ports (gRPC, agents, Prometheus metrics) to loopback only. Ray reads the switch
    from the environment in the processes it starts and from its constants module in this one."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False
    else:
        log.warning("this Ray version has no loopback switch; its local ports bind every interface")


def secure_token_file(create: bool) -> Path | None:
    """Ray's token file (RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token) readable by its owner only: made so when
    `create` and it is missing (Ray itself would write it with the umask's mode, often 0644), tightened with a
    warning when found readable by others. None when the token comes from RAY_AUTH_TOKEN or there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # made meanwhile by another run: checked below
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))  # 256 bits, as `ray get-auth-token --generate` makes
            log.info("made Ray's token file %s (mode 0600)", path)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return None
    if mode & 0o077:
        os.chmod(path, 0o600)
        log.warning("Ray's token file %s was readable by others (mode %04o); set to 0600", path, mode)
    return path


def _watch_local_ray() -> None:
    import ray

    try:
        node = ray._private.worker._global_node
        pids = [i.process.pid for infos in node.all_processes.values() for i in infos if i.process is not None]
    except AttributeError:  # another Ray version's internals: no watchdog, Ray's own clean-up only
        log.debug("cannot find the local Ray's processes; it is stopped by Ray alone if this process is killed")
        return
    from pipeline.execution.ray_watchdog import start_watchdog

    start_watchdog(pids)


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def actor_specs(nodes: list[dict], workers: int | None) -> list[ActorSpec]:
    """The engines to start on `nodes` (as `ray.nodes()` describes them). A node with no CPU (a head node kept
    for the driver) gets none."""
    specs: list[ActorSpec] = []
    cpu_nodes = []
    for node in sorted(nodes, key=lambda n: n["NodeID"]):
        res = node.get("Resources", {})
        cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
        if cpus < 1:
            continue
        if gpus >= 1:
            share = max(1, cpus // gpus)
            specs += [ActorSpec(node["NodeID"], node["NodeManagerAddress"], share, 1) for _ in range(gpus)]
        else:
            cpu_nodes.append((node, cpus))
    if cpu_nodes:
        specs += _cpu_actor_specs(cpu_nodes, workers)
    if not specs:
        raise ConfigError("the Ray cluster has no node with a CPU for an engine; add worker nodes or check "
                          "`ray status`")
    per_node = Counter(s.node_id for s in specs)
    return [replace(s, node_engines=per_node[s.node_id]) for s in specs]


def _cpu_actor_specs(cpu_nodes: list[tuple[dict, int]], workers: int | None) -> list[ActorSpec]:
    """One engine per CPU node, or `workers` engines dealt round-robin over the CPU nodes, each node's CPUs
    shared evenly among its engines."""
    count = workers if workers is not None else len(cpu_nodes)
    per_node = [count // len(cpu_nodes) + (i < count % len(cpu_nodes)) for i in range(len(cpu_nodes))]
    specs = []
    for (node, cpus), n in zip(cpu_nodes, per_node):
        if n > cpus:
            raise ConfigError(f"--workers {count} puts {n} engines on node {node['NodeManagerAddress']}, which has "
                              f"{cpus} CPUs; pass --workers {sum(c for _, c in cpu_nodes)} or fewer")
        specs += [ActorSpec(node["NodeID"], node["NodeManagerAddress"], cpus // n, 0) for _ in range(n)]
    return specs


def start_actor(spec: ActorSpec, *args, soft: bool = False):
    """A `ShardWorker` actor placed on `spec`'s node (`soft`: anywhere if that node is gone, for a replacement).
    Ray does not restart it: the driver replaces a dead actor itself and requeues its shard."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipeline.execution.worker import ShardWorker

    actor_class = ray.remote(ShardWorker)
    return actor_class.options(
        num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_restarts=0, max_concurrency=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(spec.node_id, soft=soft),
        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(spec.num_cpus)}},
    ).remote(*args)


def node_oom_kills(node_id: str, timeout: float = 15.0) -> int | None:
    """`oom_kills_here` on the node `node_id`, read by a small task placed there (no CPU reserved, so busy
    actors do not hold it up); None if the node is gone or does not answer in `timeout` seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from engine.memory.room import oom_kills_here

    task = ray.remote(oom_kills_here).options(num_cpus=0, max_retries=0,
                                                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    ref = task.remote()
    try:
        return ray.get(ref, timeout=timeout)
    except (ray.exceptions.RayError, TimeoutError) as e:
        log.debug("cannot read the OOM kills of node %s: %s", node_id, e)
        ray.cancel(ref, force=True)
        return None


class NodeOomKills:
    """Whether a lost worker was killed by the kernel's OOM killer on its node. Ray reports such a worker only as
    one that exited unexpectedly (OOM killer, `ray stop --force` or a crash, it says), on any node; the node's
    own count of OOM kills, read when its workers start and again after one is lost, tells which."""

    def __init__(self, probe=node_oom_kills):
        self._probe = probe
        self._seen: dict[str, int] = {}

    def note(self, node_id: str | None, count: int | None) -> None:
        if node_id and count is not None:
            self._seen[node_id] = count

    def killed(self, node_id: str, node_ip: str) -> str | None:
        """Why the worker that ran on `node_id` died for memory, or None."""
        before, now = self._seen.get(node_id), self._probe(node_id)
        self.note(node_id, now)
        if before is not None and now is not None and now > before:
            return f"the kernel's OOM killer on node {node_ip}, whose OOM kill count went from {before} to {now}"
        return None
