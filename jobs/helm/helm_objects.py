"""flexbatch keeps HELM's objects as the JSON HELM writes (scenario_state.json's instances and request states);
HELM's functions take its dataclasses. These convert between the two, and keep HELM's global seeding from
touching the process's random generators.
"""

from __future__ import annotations

import json
import random
from contextlib import contextmanager


def to_instance(instance: dict):
    """HELM's `Instance` of an instance's JSON."""
    import dacite
    from helm.benchmark.scenarios.scenario import Instance

    return dacite.from_dict(Instance, instance)


def to_request_state(state: dict):
    """HELM's `RequestState` of a request state's JSON; fields HELM does not know are left out."""
    import dacite
    from helm.benchmark.adaptation.request_state import RequestState

    return dacite.from_dict(RequestState, {"reference_index": None, "request_mode": None, "output_mapping": None,
                                           "result": None, "num_train_instances": 0, "prompt_truncated": False,
                                           **state})


def to_adapter_spec(adapter_spec: dict):
    import dacite
    from helm.benchmark.adaptation.adapter_spec import AdapterSpec

    return dacite.from_dict(AdapterSpec, adapter_spec)


def to_json(obj) -> dict:
    """A HELM dataclass as HELM writes it to its JSON files (no null fields; tuples become lists)."""
    from helm.common.general import asdict_without_nones

    return json.loads(json.dumps(asdict_without_nones(obj)))


@contextmanager
def kept_random_state():
    """HELM seeds Python's and numpy's global generators (`random.seed(trial)` for few-shot examples,
    `np.random.seed(0)` for the evaluated instances): the process's own draws go on as if it had not."""
    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
