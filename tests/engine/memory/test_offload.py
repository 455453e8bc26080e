"""The offload folder: scratch files are private, never follow a planted link and leave nothing behind."""

import os
import tempfile

import torch

from engine.memory import offload
from engine.memory.placement import alloc
from engine.memory.tiers import Devices


def _mapped_paths() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def test_scratch_files_live_in_the_offload_folder_and_never_follow_planted_links(tmp_path, monkeypatch):
    shared_tmp, home_offload = tmp_path / "tmp", tmp_path / "home-offload"
    (shared_tmp / "flexbatch-scratch").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    for n in range(64):  # the names the old scratch scheme would have chosen
        os.symlink(victim, shared_tmp / "flexbatch-scratch" / f"{os.getpid()}-{n}.bin")
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.setattr(offload, "DEFAULT_OFFLOAD_DIR", home_offload)
    t = alloc(Devices(), "disk", (4, 16), torch.float32, "kv cache")
    t.fill_(1.5)
    assert victim.read_bytes() == b"precious"
    assert str(home_offload) in _mapped_paths()  # the mapping is a file of the offload folder
    assert list(home_offload.iterdir()) == []  # its name and private folder are already gone
    assert float(t.sum()) == 1.5 * 64


def test_scratch_in_a_given_offload_dir_is_mapped_shared_and_left_clean(tmp_path):
    t = offload.scratch_tensor(tmp_path, (3, 5), torch.bfloat16)
    t.copy_(torch.arange(15, dtype=torch.bfloat16).view(3, 5))
    assert t.shape == (3, 5) and t[2, 4].item() == 14
    assert f"{tmp_path}/scratch-" in _mapped_paths() and list(tmp_path.iterdir()) == []


VARIANT = "llama_gqa_llama3"


def _tokens(engine):
    """The engine's tokens for two prompts (once `generate` returns, nothing reads a layer file: a test may
    rewrite one in place)."""
    from engine.request import Request, SamplingParams

    reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(["The quick", "def add("])]
    return [c.token_ids for c in engine.generate(reqs)]


def _engine(checkpoint, tmp_path, weight_cpu):
    from engine.engine import Engine
    from engine.policy import Policy

    return Engine.load(checkpoint(VARIANT), dtype="float32", policy=Policy(weight_cpu=weight_cpu), offload_dir=tmp_path)


def test_a_partial_offload_folder_is_completed_not_trusted(checkpoint, tmp_path, offload_copies):
    from engine.engine import Engine

    expected = _tokens(Engine.load(checkpoint(VARIANT), dtype="float32"))
    half = _engine(checkpoint, tmp_path, 0.5)  # one layer on disk: the folder holds that layer only
    assert len(list(tmp_path.rglob("layer_*.safetensors"))) == 1
    assert _tokens(half) == expected
    every = _engine(checkpoint, tmp_path, 0.0)  # both layers on disk: the missing one is built
    assert _tokens(every) == expected and len(list(tmp_path.rglob("layer_*.safetensors"))) == 2


def test_a_torn_or_unrecorded_layer_file_is_rebuilt(checkpoint, tmp_path, offload_copies):
    from engine.memory.offload import stored_layer

    expected = _tokens(_engine(checkpoint, tmp_path, 0.0))
    first, second = sorted(tmp_path.rglob("layer_*.safetensors"))
    folder = first.parent
    first.write_bytes(first.read_bytes()[:100])  # torn, as by a crash in a writer that did not rename
    (folder / "layer_0001.json").unlink()  # a file whose completion record was never written
    assert stored_layer(folder, 0) is None and stored_layer(folder, 1) is None
    assert _tokens(_engine(checkpoint, tmp_path, 0.0)) == expected
    assert stored_layer(folder, 0) is not None and stored_layer(folder, 1) is not None
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_layer_file_changed_in_place_is_rebuilt(checkpoint, tmp_path, caplog, offload_copies):
    """Same size, same header, one byte of tensor data flipped: only the recorded SHA-256 tells."""
    import struct

    from engine.memory.offload import stored_layer

    expected = _tokens(_engine(checkpoint, tmp_path, 0.0))
    path = sorted(tmp_path.rglob("layer_*.safetensors"))[0]
    data = bytearray(path.read_bytes())
    at = 8 + struct.unpack("<Q", data[:8])[0] + 5  # past the length and the JSON header: in the first tensor
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    assert stored_layer(path.parent, 0) is None and "does not match its record" in caplog.text
    assert _tokens(_engine(checkpoint, tmp_path, 0.0)) == expected
    assert path.read_bytes()[at] == data[at] ^ 0xFF and stored_layer(path.parent, 0) is not None


def test_two_processes_converting_one_model_at_once_leave_a_sound_folder(checkpoint, tmp_path):
    import subprocess
    import sys

    from engine.memory.offload import stored_layer

    model = checkpoint(VARIANT)
    code = ("import sys; from engine.engine import Engine; from engine.policy import Policy; "
            "import engine.memory.weight_store as ws; ws.checkpoint_plans = lambda *args: {}; "
            "Engine.load(sys.argv[1], dtype='float32', policy=Policy(weight_cpu=0.0), offload_dir=sys.argv[2]); "
            "print('loaded')")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(model), str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folder = next(tmp_path.rglob("layer_0000.safetensors")).parent
    assert stored_layer(folder, 0) is not None and stored_layer(folder, 1) is not None
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_no_read_ahead_outlives_the_call(checkpoint, tmp_path):
    """The last step of a call reads the first layer ahead for a step that does not come in this call: when
    `generate` returns, that read is done or cancelled and its buffers handed back, so no layer file is still being
    read (a file rewritten in place under a mapping being read is a bus error) and no layer is held between calls."""
    import threading
    import time

    eng = _engine(checkpoint, tmp_path, 0.0)  # every layer on disk
    store, load = eng.weights, eng.weights._load
    ahead, spans = threading.Event(), []

    def slow_load(i, device):
        start = time.perf_counter()
        if threading.current_thread() is not threading.main_thread():
            ahead.set()
            time.sleep(0.3)  # a read ahead still reading when the call's last step is done
        try:
            return load(i, device)
        finally:
            spans.append((start, time.perf_counter()))

    store._load = slow_load
    first = _tokens(eng)
    returned = time.perf_counter()
    time.sleep(0.5)  # long enough for a read left running to end (or one left queued to start)
    assert ahead.is_set() and all(end < returned for _, end in spans)
    assert store._pending == {} and store._in_use is None
    assert _tokens(eng) == first  # the next call reads its first layer itself
