"""--memory-limit: each side runs as a whole process in its own cgroup v1 memory group; where groups cannot be
made the option is refused before any work; a side that outgrows the limit is reported as OOM-killed."""

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs import cli
from jobs.bench import memory_limit as ml
from jobs.bench import models as bm


def test_refused_where_cgroups_are_not_writable(tmp_path, monkeypatch):
    with pytest.raises(ml.CgroupUnavailable, match="--memory-limit needs a writable cgroup v1"):
        ml.check_cgroups(tmp_path)
    monkeypatch.setattr(ml, "CGROUP_ROOT", tmp_path)
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "1GiB", "--output",
                                           str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "writable cgroup v1 memory controller" in result.output
    assert not (tmp_path / "x.json").exists()
    result = CliRunner().invoke(cli.main, ["bench", "engine", "--memory-limit", "lots"])
    assert result.exit_code == 2 and "--memory-limit='lots' is not a size" in result.output


def _writable() -> bool:
    try:
        ml.check_cgroups()
        return os.geteuid() == 0
    except ml.CgroupUnavailable:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _writable(), reason="needs root and a writable cgroup v1 memory controller")
def test_each_side_runs_in_its_own_group_and_oom_is_reported(tmp_path):
    model = bm.build_checkpoint("tiny", tmp_path / "cache")
    side = ml.Side("flexbatch", str(model), rows=4, prompt_len=8, gen_len=4, batch=4, cpu_bytes=200 << 20,
                   offload_dir=str(tmp_path / "off"))
    ok = ml.run_side(side, 900 << 20, timeout_s=600)
    assert ok["result"]["tokens"] == 16 and not ok["oom_killed"], ok
    assert 0 < ok["peak_bytes"] <= 900 << 20
    starved = ml.run_side(side, 60 << 20, timeout_s=600)
    assert starved["result"] is None and starved["oom_killed"], starved
    assert not list(Path(ml.CGROUP_ROOT).glob(f"flexbatch-bench-{os.getpid()}-*"))
