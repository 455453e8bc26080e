import os
import tempfile
from pathlib import Path

import pytest

from tests.checkpoints import make_checkpoint

# The suite keeps its own cache root (engine/cache_root.py reads it when first imported): set here, when this file is
# loaded, before the conftest files below it (which pytest loads before pytest_configure, and some of which import
# the engine) and any test module: tests neither read nor write the user's hardware profile, kernel rates or
# offloaded weights. Subprocesses and Ray workers the tests start inherit it.
os.environ["FLEXBATCH_CACHE"] = tempfile.mkdtemp(prefix="flexbatch-tests-")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(variant)` builds (once per session) and returns the folder of a tiny random checkpoint."""
    made = {}

    def get(variant: str):
        if variant not in made:
            made[variant] = make_checkpoint(tmp_path_factory.mktemp(variant), variant)
        return made[variant]

    return get


@pytest.fixture(scope="session")
def chat_checkpoint(tmp_path_factory):
    """`chat_checkpoint(style)` builds (once per session) a tiny random checkpoint with a real chat template, one of
    tests/chat_checkpoints.py CHAT_STYLES (Llama 3, Qwen2, Mistral, Qwen3, Gemma 2, Gemma 3, Phi-3.5, SmolLM3)."""
    from tests.chat_checkpoints import make_chat_checkpoint

    made = {}

    def get(style: str):
        if style not in made:
            made[style] = make_chat_checkpoint(tmp_path_factory.mktemp(f"chat-{style}"), style)
        return made[style]

    return get


@pytest.fixture(scope="session")
def tiny_llama_dir(checkpoint):
    return checkpoint("llama_gqa_llama3")


REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "examples" / "demo-model"
DEMO_PROMPTS = REPO / "examples" / "prompts.parquet"


@pytest.fixture(scope="session")
def demo_model_dir():
    assert (DEMO_MODEL / "config.json").is_file(), f"the demo model is missing from {DEMO_MODEL}"
    return DEMO_MODEL


@pytest.fixture(scope="session")
def demo_prompts():
    import pyarrow.parquet as pq

    return pq.read_table(DEMO_PROMPTS, columns=["prompt"]).column("prompt").to_pylist()


@pytest.fixture(scope="session", autouse=True)
def fixed_hardware_profile():
    """Jobs that plan without --hardware read this machine's cached profile and measure it on first use (minutes
    on 2 cores). The suite plans on a fixed profile instead (tests/planner/specs.py `server_cpu`), stored as this
    machine's for every thread count a test or worker may run with; tests of the profiler fake or measure their
    own."""
    import dataclasses
    import time

    import torch

    from planner import profiler
    from planner.hardware import save_hardware
    from tests.planner.specs import server_cpu

    own = Path(os.environ["FLEXBATCH_CACHE"])
    assert own in profiler.DEFAULT_CACHE.parents, (
        f"the suite's profile would go to {profiler.DEFAULT_CACHE}, outside its own cache {own}: the engine was "
        "imported before this file set FLEXBATCH_CACHE")
    threads = torch.get_num_threads()
    try:
        for n in range(1, (os.cpu_count() or 1) + 1):
            torch.set_num_threads(n)
            key = profiler.machine_key()
            sources = {"machine": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "load_average": 0.0, "cpus": os.cpu_count() or 1}
            save_hardware(dataclasses.replace(server_cpu(), sources=sources),
                          profiler.keyed_copy(profiler.DEFAULT_CACHE, key))
    finally:
        torch.set_num_threads(threads)


_shared_head: dict = {}  # the shared head while it runs: "head" (tests/ray_cluster.py RayHead) and "sid"


@pytest.fixture
def shared_ray():
    """One Ray head for the session's tests that only need a cluster to run on (not those of how a local Ray
    starts, stops or dies, which start their own): 2 CPUs on 127.0.0.1, token authentication with the token a
    local Ray of flexbatch's would use (`secure_token_file`: Ray caches the token it reads once per process), and
    its job server (tests/ray_cluster.py). Jobs join it by address: `ray_address` in-process, `--address
    shared_ray.address` with `shared_ray.env` in a subprocess. Started by the first test that asks for it and
    stopped after the last one in a row (`pytest_runtest_teardown`; the SERIAL tests that use it run one after
    another) or at the end of the session: idle, its daemons and Ray Data's actors take a share of a core."""
    if not _shared_head:
        from pipeline.execution.ray_runtime import secure_token_file
        from tests.ray_cluster import start_head

        token_path = secure_token_file(create=True)
        if token_path is None:  # the token comes from RAY_AUTH_TOKEN: `ray start` reads it from there too
            token_path = Path(tempfile.mkdtemp(prefix="fb-token-")) / "token"
            token_path.write_text(os.environ["RAY_AUTH_TOKEN"])
            token_path.chmod(0o600)
        _shared_head["head"], _shared_head["sid"] = start_head(2, token_path)
    return _shared_head["head"]


def _stop_shared_head() -> None:
    if _shared_head:
        from tests.ray_cluster import stop_head

        head, sid = _shared_head.pop("head"), _shared_head.pop("sid")
        stop_head(sid, head, grace_s=2.0)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or "shared_ray" not in getattr(nextitem, "fixturenames", ()):
        _stop_shared_head()


def pytest_sessionfinish(session, exitstatus):
    _stop_shared_head()


@pytest.fixture
def ray_address(shared_ray, monkeypatch):
    """The shared head's address, for a job that joins it from this process; this process leaves the cluster
    afterwards. Token authentication stays on in this process and those it starts (RAY_AUTH_MODE=token), as a
    local Ray started here turns it on: Ray reads the mode once per process, and a cluster this process starts
    later (ray.cluster_utils) must use the mode it keeps."""
    from ray._raylet import AuthenticationMode, Config, get_authentication_mode

    os.environ["RAY_AUTH_MODE"] = "token"
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        Config.initialize("")  # read the mode again, as Ray's own local start does
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield shared_ray.address
    import ray

    ray.shutdown()


# Tests that start a Ray cluster (or kill the processes of one), and those that join the shared one (`shared_ray`):
# with `pytest -n 2` (the Makefile's) they run one after another on one worker, never two clusters or two jobs on
# the shared one at once; the rest of the suite is spread over both workers.
SERIAL = ("tests/pipeline/execution/test_chaos.py", "tests/pipeline/execution/test_driver_ray.py",
          "tests/pipeline/execution/test_ray_hygiene.py", "tests/jobs/test_submit.py", "tests/jobs/helm/test_ray.py",
          "tests/jobs/test_cli.py::test_python_m_jobs_run_end_to_end",
          "tests/jobs/wrangle/test_command.py::test_job_on_ray_with_two_actors",
          "tests/flexbatch/test_api.py::test_ray_data_pipeline_equals_flexbatch_run")
# Ray Data leaves actors of its own on the cluster (stats, autoscaling): its test is the shared head's last.
SHARED_LAST = ("tests/flexbatch/test_api.py::test_ray_data_pipeline_equals_flexbatch_run",)


def _serial_order(item) -> int:
    """The SERIAL tests' order: those on the shared head first, in a row (it is stopped after the last), then
    those that start a cluster of their own."""
    if "shared_ray" in getattr(item, "fixturenames", ()):
        return 1 if item.nodeid.startswith(SHARED_LAST) else 0
    return 2


def _shares_a_module_fixture(item) -> bool:
    """Whether the test uses a module- or class-scoped fixture (a model loaded once, a HELM workflow run once):
    with its module's tests spread over both xdist workers, each worker would build it."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope in ("module", "class"):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into the node ids it schedules by
def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped without CUDA; tests marked `ipex` where intel-extension-for-pytorch cannot
    run (it needs torch 2.8); the SERIAL tests share one xdist group, in `_serial_order`; the tests of a module
    that share a module-scoped fixture share a group of their own (one worker builds the fixture once)."""
    import torch

    serial = [item for item in items
              if item.nodeid.startswith(SERIAL) or "shared_ray" in getattr(item, "fixturenames", ())]
    for item in serial:
        item.add_marker(pytest.mark.xdist_group("serial"))
    chosen = {id(item) for item in serial}
    for item in items:
        if id(item) not in chosen and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items[:] = [item for item in items if id(item) not in chosen] + sorted(serial, key=_serial_order)

    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(pytest.mark.skip(reason="needs CUDA (run scripts/device_check.sh on a GPU machine)"))
    marked = [item for item in items if item.get_closest_marker("ipex") is not None]
    if not marked:
        return
    from tests.ipex_check import ipex_missing

    reason = ipex_missing()
    for item in marked if reason else ():
        item.add_marker(pytest.mark.skip(reason=f"needs the ipex backend: {reason}"))


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if any model is loaded: for checks that must come before the weights."""
    from engine.engine import Engine

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(Engine, "load", refuse)


@pytest.fixture
def one_thread():
    """Small ops run on one thread (no OpenMP stalls when the cores are shared); benchmarks may change torch's
    thread count, so it is given back afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def dense_compressed_weights(monkeypatch):
    """Compressed weights take the dequantize + GEMM path in every test unless the test picks a kernel
    (`compressed_kernels`): which path wins is measured per machine, and tests must not depend on it."""
    monkeypatch.setattr("engine.kernels.native.max_rows", lambda fmt, n, k, dtype: 0)


@pytest.fixture(autouse=True)
def chunked_decode_attention(monkeypatch):
    """Decode attention takes the chunked path in every test unless the test picks SDPA (`sdpa_decode`): which
    kernel is faster is measured per machine, and tests must not depend on it."""
    monkeypatch.setattr("engine.kernels.decode_choice.decode_kernel", lambda *a: "chunked")


@pytest.fixture
def sdpa_decode(monkeypatch):
    monkeypatch.setattr("engine.kernels.decode_choice.decode_kernel", lambda *a: "sdpa")


@pytest.fixture(autouse=True)
def sdpa_prefill_attention(monkeypatch):
    """Prefill attention by SDPA in every test unless the test picks the own kernel (`own_prefill`): which is
    faster is measured per machine, and tests must not depend on it."""
    monkeypatch.setattr("engine.kernels.prefill_choice.prefill_kernel", lambda *a: "sdpa")


@pytest.fixture
def own_prefill(monkeypatch):
    """Prefill attention by the project's own kernel wherever it takes the shape (bf16)."""
    monkeypatch.setattr("engine.kernels.prefill_choice.prefill_kernel", lambda *a: "own")


@pytest.fixture
def own_decode(monkeypatch):
    """Decode attention by the project's own kernel wherever it takes the shape (engine/kernels/own_attention.py)."""
    monkeypatch.setattr("engine.kernels.decode_choice.decode_kernel", lambda *a: "own")


@pytest.fixture
def compressed_kernels(monkeypatch):
    """Compressed weights computed by the compressed kernels (int4pack, int8 x int8) at every row count."""
    monkeypatch.setattr("engine.kernels.native.max_rows", lambda fmt, n, k, dtype: 1 << 30)
