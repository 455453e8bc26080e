import pytest

from pipeline.errors import ConfigError
from pipeline.execution.ray_runtime import actor_specs


def _node(node_id, cpus, gpus=0, alive=True):
    resources = {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}
    return {"NodeID": node_id, "NodeManagerAddress": f"10.0.0.{node_id}", "Resources": resources, "Alive": alive}


def test_one_actor_per_gpu_with_its_share_of_cpus_and_none_on_a_cpu_less_head():
    specs = actor_specs([_node("1", 0), _node("2", 32, gpus=2), _node("3", 16)], workers=None)
    assert [(s.node_id, s.num_cpus, s.num_gpus) for s in specs] == [("2", 16, 1), ("2", 16, 1), ("3", 16, 0)]
    assert [s.node_engines for s in specs] == [2, 2, 1]  # the two GPU engines share node 2's memory


def test_workers_are_spread_over_the_cpu_nodes_and_split_their_cpus():
    specs = actor_specs([_node("a", 8), _node("b", 4)], workers=3)
    assert [(s.node_id, s.num_cpus) for s in specs] == [("a", 4), ("a", 4), ("b", 4)]
    assert [s.node_engines for s in specs] == [2, 2, 1]  # each engine on node a plans within half its memory


def test_more_workers_than_cpus_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"--workers 3 puts 3 engines on node 10.0.0.a, which has 2 CPUs; "
                                          r"pass --workers 2 or fewer"):
        actor_specs([_node("a", 2)], workers=3)


def test_a_cluster_without_cpus_is_refused():
    with pytest.raises(ConfigError, match="no node with a CPU"):
        actor_specs([_node("h", 0)], workers=None)


def test_a_worker_lost_on_another_node_is_blamed_on_memory_only_if_its_oom_kill_count_rose():
    from pipeline.execution.ray_runtime import NodeOomKills

    counts = {"n1": 4, "n2": None, "n3": 9}
    kills = NodeOomKills(probe=lambda node: counts[node])
    kills.note("n1", 3)
    assert "OOM killer on node 10.0.0.1, whose OOM kill count went from 3 to 4" in kills.killed("n1", "10.0.0.1")
    assert kills.killed("n1", "10.0.0.1") is None  # the reading after a loss is the next baseline
    kills.note("n2", 0)
    assert kills.killed("n2", "10.0.0.2") is None  # the node no longer answers: not known to be memory
    assert kills.killed("n3", "10.0.0.3") is None  # no baseline
