"""Each option value is checked before the run against what the job can do: an empty path, a --max-new-tokens
beyond the model's context, a seed beyond 64 bits are one-line errors, exit 2, before any model loads."""

import pytest
import torch
from click.testing import CliRunner

import flexbatch
from engine.options import OptionError
from engine.request import MAX_SEED, SamplingParams, check_context
from engine.spec import load_model_spec
from jobs import cli
from tests.jobs.test_cli import assert_user_error
from tests.pipeline.parquet_files import write_parquet


def _run(tmp_path, model, *args):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    return CliRunner().invoke(cli.main, ["run", "--no-ray", "--model", str(model), "--input", str(f), "--output",
                                         str(tmp_path / "out"), *args])


@pytest.mark.parametrize("flag", ["--offload-dir", "--hardware"])
def test_an_empty_path_is_refused(tmp_path, tiny_llama_dir, no_model_load, flag):
    assert_user_error(_run(tmp_path, tiny_llama_dir, flag, ""), f"{flag}='' is invalid: expected a non-empty path")


def test_max_new_tokens_beyond_the_models_context_is_refused_before_the_run(tmp_path, tiny_llama_dir, no_model_load):
    context = load_model_spec(tiny_llama_dir).max_position_embeddings
    for value in (10**12, context):
        assert_user_error(_run(tmp_path, tiny_llama_dir, "--max-new-tokens", str(value)),
                          f"--max-new-tokens={value} is invalid: expected a whole number in [1, {context - 1}] "
                          f"(the model's context holds {context} tokens")
    assert not (tmp_path / "out").exists()
    with pytest.raises(OptionError, match=f"^max_new_tokens={10**12} is invalid"):
        flexbatch.run(tiny_llama_dir, str(tmp_path / "a.parquet"), str(tmp_path / "out"), use_ray=False,
                      max_new_tokens=10**12)
    check_context(SamplingParams(max_new_tokens=context - 1), context)  # room for a one-token prompt


def test_a_seed_beyond_64_bits_is_refused_not_reduced(tmp_path, tiny_llama_dir, no_model_load):
    assert_user_error(_run(tmp_path, tiny_llama_dir, "--seed", str(2**64)),
                      f"--seed={2**64} is invalid: expected a whole number in [0, {MAX_SEED}] (torch's generators "
                      "take 64-bit seeds)")
    with pytest.raises(OptionError, match="seed="):
        SamplingParams(seed=2**70)
    assert torch.Generator().manual_seed(SamplingParams(seed=MAX_SEED).seed).initial_seed() == MAX_SEED
