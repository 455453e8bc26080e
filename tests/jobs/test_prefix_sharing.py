"""`flexbatch run` shares a few-shot prefix by default: the completions equal those of `--prefix-sharing off`, row
for row, and `_SUCCESS` and the summary say how many prompt tokens the shared prefix saved."""

import json

from click.testing import CliRunner

from jobs import cli
from tests.engine.loop.test_shared_prefix import FEW_SHOT
from tests.pipeline.parquet_files import read_rows, write_parquet

QUESTIONS = ["Q: is 7 = 7? A:", "Q: is 2 = 9? A:", "Q: is 6 = 6? A:", "Q: 5?", "Q: is 1 = 0? A:", "Q: x?"]


def _run(tmp_path, model, name, *more):
    out = tmp_path / name
    result = CliRunner().invoke(cli.main, ["run", "--no-ray", "--input", str(tmp_path / "in.parquet"), "--output",
                                           str(out), "--model", str(model), "--dtype", "float32",
                                           "--max-new-tokens", "6", *more])
    assert result.exit_code == 0, (result.output, result.exception)
    return out, result.output


def test_a_shared_prefix_saves_prompt_tokens_and_changes_no_completion(tmp_path, tiny_llama_dir):
    write_parquet(tmp_path / "in.parquet", prompt=[FEW_SHOT + q for q in QUESTIONS])
    shared, text = _run(tmp_path, tiny_llama_dir, "shared")
    alone, _ = _run(tmp_path, tiny_llama_dir, "alone", "--prefix-sharing", "off")
    assert [r["completion"] for r in read_rows(shared)] == [r["completion"] for r in read_rows(alone)]
    record = json.loads((shared / "_SUCCESS").read_text())["shared_prefix"]
    assert record["shared_tokens"] >= 32 and record["saved_prompt_tokens"] >= (len(QUESTIONS) - 1) * 32, record
    assert 0 < record["saved_share"] < 1
    assert "shared prefixes:" in text
    off = json.loads((alone / "_SUCCESS").read_text())["shared_prefix"]
    assert off == {"shared_tokens": 0, "saved_prompt_tokens": 0, "saved_share": 0.0}
    assert json.loads((alone / "_job.json").read_text())["run"]["pins"].get("share_prefix") is False
