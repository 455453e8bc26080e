"""What a worker reports to the driver once set up (`WorkerSetup`): typed for the driver, which sizes shards by
its policy's block, and recorded in `_job.json` and the summary as before."""

import json

from engine.batching import BLOCKS_PER_SHARD
from engine.policy import Policy
from pipeline.execution.driver import derived_shard_rows
from pipeline.execution.worker import WorkerSetup

KEYS = ["worker", "pid", "host", "threads", "policy", "predicted", "setup_seconds", "node", "node_engines",
        "cpu_budget", "oom_kills", "engine_reused"]


def _setup(worker: int, policy: Policy) -> WorkerSetup:
    return WorkerSetup(worker=worker, pid=100 + worker, host="h", threads=2, policy=policy, predicted=None,
                       setup_seconds=1.5, node=None, node_engines=1, cpu_budget=2.0**30, oom_kills=None,
                       engine_reused=False)


def test_the_record_is_the_json_the_job_files_hold():
    record = _setup(0, Policy(gbs=4, num_gb=3)).record()
    assert list(record) == KEYS
    assert json.loads(json.dumps(record)) == record and Policy.from_dict(record["policy"]) == Policy(gbs=4, num_gb=3)


def test_derived_shards_hold_blocks_of_the_largest_planned_block():
    infos = [_setup(0, Policy(gbs=4, num_gb=3)), _setup(1, Policy(gbs=2, num_gb=1))]
    assert derived_shard_rows(10_000, infos) == 12 * BLOCKS_PER_SHARD
    assert derived_shard_rows(30, infos) == 15  # no more than a worker's share
