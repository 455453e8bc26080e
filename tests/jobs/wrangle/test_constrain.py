"""Closed answer sets: entity matching and error detection answer one of the template's two words, enforced
while decoding (on by default); the paper's error-detection wording, which the demo model answers with neither
word, then parses every row."""

import json
from pathlib import Path

from jobs.wrangle.command import WrangleConfig, answer_constraint, run_wrangle
from jobs.wrangle.tasks import get_template
from pipeline.plan.settings import EngineSettings

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "examples" / "wrangle"


def _run(tmp_path, constrain: bool):
    config = WrangleConfig(task="error_detection", data=DATA / "error_detection", output=tmp_path / str(constrain),
                           model=REPO / "examples" / "demo-model", template="paper", limit=6, constrain=constrain,
                           engine=EngineSettings(dtype="float32", use_ray=False))
    return run_wrangle(config)


def test_a_constrained_run_parses_every_answer_where_a_free_one_parses_none(tmp_path):
    free, constrained = _run(tmp_path, False), _run(tmp_path, True)
    assert free.metrics["unparsed"] == 6 and constrained.metrics["unparsed"] == 0
    assert json.loads(constrained.metrics_path.read_text())["constrained"] is True
    assert json.loads(free.metrics_path.read_text())["constrained"] is False


def test_imputation_is_never_constrained(tmp_path):
    config = WrangleConfig(task="data_imputation", data=DATA / "data_imputation", output=tmp_path,
                           model=tmp_path, impute_column="country")
    assert answer_constraint(config, get_template("data_imputation", None)) is None
    matching = WrangleConfig(task="entity_matching", data=DATA / "entity_matching", output=tmp_path, model=tmp_path)
    assert answer_constraint(matching, get_template("entity_matching", None)).choice == (" Yes", " No")
