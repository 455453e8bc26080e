"""The Ray Data stage refuses what it cannot do before any row runs: a model folder that is not a checkpoint (when
the stage is built), and input columns it would overwrite."""

import pytest

from engine.errors import FlexbatchError
from engine.policy import Policy
from flexbatch.ray import OUTPUT_COLUMNS, Processor, build_processor
from pipeline.errors import ConfigError


def test_build_processor_checks_the_model_folder_at_once(tmp_path):
    with pytest.raises(FlexbatchError, match="nonexistent"):
        build_processor(str(tmp_path / "nonexistent"), concurrency=1, batch_size=4)
    with pytest.raises(FlexbatchError, match="nonexistent"):
        Processor(str(tmp_path / "nonexistent"))


@pytest.mark.parametrize("column", OUTPUT_COLUMNS)
def test_the_stage_refuses_input_columns_it_would_overwrite(demo_model_dir, column):
    stage = Processor(demo_model_dir, max_new_tokens=2, dtype="float32", policy=Policy(gbs=2, num_gb=1))
    with pytest.raises(ConfigError, match=f"'{column}'.*rename or drop"):
        stage({"prompt": ["copy: abc ->"], column: ["the user's own"]})
    assert stage.engine is None  # refused before the model loads


def test_the_stage_refuses_a_policy_that_is_not_one(demo_model_dir):
    with pytest.raises(ConfigError, match=r"policy=\{'gbs': 2\} is invalid: expected an engine.policy.Policy"):
        Processor(demo_model_dir, policy={"gbs": 2})
    with pytest.raises(ConfigError, match="budgets='lots' is invalid"):
        Processor(demo_model_dir, budgets="lots")
