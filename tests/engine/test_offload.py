"""The offload folder: scratch files are private, never follow a planted link and leave nothing behind."""

import os
import tempfile

import torch

from engine import offload
from engine.placement import alloc
from engine.tiers import Devices


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
