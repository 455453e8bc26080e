"""Run in a subprocess: place a checkpoint's layers in CPU memory under a weight format ("none", "int4", "int8")
and report, as JSON, the peak RSS growth over the load and the bytes the layers are stored in."""

import json
import sys

from tests.engine.memory_probe import status_bytes


def main(model_dir: str, fmt: str) -> None:
    import torch

    import engine.kernels.native
    from engine.checkpoint import CheckpointReader
    from engine.engine import codecs_for
    from engine.memory.tiers import Devices
    from engine.memory.weight_store import WeightStore
    from engine.policy import Policy
    from engine.spec import load_model_spec

    engine.kernels.native.max_rows = lambda fmt, n, k, dtype: 0  # as in the tests: no kernel measurement in the load
    policy = Policy(compress_weight=fmt != "none", weight_format="int4" if fmt == "none" else fmt)
    reader = CheckpointReader(model_dir, load_model_spec(model_dir))
    codec, _ = codecs_for(policy, torch.float32)
    baseline = status_bytes("VmRSS")
    store = WeightStore(reader, policy, Devices(), torch.float32, codec=codec)
    print(json.dumps({"peak_growth": status_bytes("VmHWM") - baseline, "stored": sum(store.layer_bytes)}))
    store.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
