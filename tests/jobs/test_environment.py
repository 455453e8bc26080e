"""A bad value of an environment variable flexbatch reads is a user error like a bad option: one line naming the
variable, the value and the values it takes, exit 2, before any model loads (on the command line, through
`python -m jobs.run` and `flexbatch.run`)."""

import pytest
from click.testing import CliRunner

import flexbatch
from engine.env_settings import EnvSettingError
from jobs import cli
from jobs.run_cmd import run
from tests.jobs.test_cli import assert_user_error
from tests.pipeline.parquet_files import write_parquet

BAD = [("FLEXBATCH_ISA", "bogus", "FLEXBATCH_ISA='bogus' is invalid: expected one of avx512, avx2, scalar"),
       ("FLEXBATCH_ISA", "AVX2", "FLEXBATCH_ISA='AVX2' is invalid"),
       ("FLEXBATCH_KERNELS", "maybe", "FLEXBATCH_KERNELS='maybe' is invalid: expected one of on, off")]


@pytest.mark.parametrize(("name", "value", "fragment"), BAD)
def test_every_command_refuses_a_bad_setting_in_one_line(tmp_path, tiny_llama_dir, no_model_load, name, value,
                                                          fragment):
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    args = ["--model", str(tiny_llama_dir), "--input", str(f), "--output", str(tmp_path / "out"), "--no-ray"]
    assert_user_error(CliRunner().invoke(cli.main, ["run", *args], env={name: value}), fragment)
    assert_user_error(CliRunner().invoke(run, args, env={name: value}), fragment)  # python -m jobs.run
    assert_user_error(CliRunner().invoke(cli.main, ["plan", "--model", str(tiny_llama_dir)], env={name: value}),
                      fragment)


def test_the_python_api_refuses_a_bad_setting_before_the_model(tmp_path, tiny_llama_dir, no_model_load, monkeypatch):
    monkeypatch.setenv("FLEXBATCH_ISA", "bogus")
    f = write_parquet(tmp_path / "a.parquet", prompt=["hi"])
    with pytest.raises(EnvSettingError, match="FLEXBATCH_ISA='bogus'"):
        flexbatch.run(tiny_llama_dir, str(f), str(tmp_path / "out"), use_ray=False)


def test_a_cache_setting_that_names_a_file_is_refused(tmp_path, tiny_llama_dir):
    f = tmp_path / "a-file"
    f.write_text("")
    result = CliRunner().invoke(cli.main, ["plan", "--model", str(tiny_llama_dir)], env={"FLEXBATCH_CACHE": str(f)})
    assert_user_error(result, f"FLEXBATCH_CACHE={str(f)!r} is invalid: it is not a folder")
