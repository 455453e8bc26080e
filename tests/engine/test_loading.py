"""Checkpoint folders: sharded safetensors, key prefixes, and clear errors for what cannot be loaded."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.engine import Engine
from engine.errors import ModelNotFoundError, UnsupportedModelError, WeightFormatError
from engine.request import Request, SamplingParams
from engine.spec import load_model_spec
from tests.checkpoints import make_checkpoint
from tests.engine.reference import PROMPTS


def _tokens(model_dir):
    reqs = [Request(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(PROMPTS)]
    return [c.token_ids for c in Engine.load(model_dir, dtype="float32").generate(reqs)]


def test_sharded_checkpoint_gives_the_same_tokens(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    src = checkpoint("llama_tied")
    sharded = tmp_path / "sharded"
    shutil.copytree(src, sharded)
    for f in sharded.glob("*.safetensors"):
        f.unlink()
    AutoModelForCausalLM.from_pretrained(src).save_pretrained(sharded, max_shard_size="100KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1
    assert (sharded / "model.safetensors.index.json").is_file()
    assert _tokens(sharded) == _tokens(src)


def test_original_opt_key_names_without_model_prefix(checkpoint, tmp_path):
    src = checkpoint("opt350m")
    renamed = tmp_path / "opt"
    shutil.copytree(src, renamed)
    weights = load_file(renamed / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in weights.items()}, renamed / "model.safetensors")
    assert _tokens(renamed) == _tokens(src)


def test_pickle_only_checkpoint_is_refused(checkpoint, tmp_path):
    d = tmp_path / "pickled"
    shutil.copytree(checkpoint("llama_tied"), d)
    (d / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, d / "pytorch_model.bin")
    with pytest.raises(WeightFormatError, match="pytorch_model.bin.*safetensors"):
        load_model_spec(d)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model_spec(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model_spec(tmp_path)


def test_unknown_model_type_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_bigcode"}))
    with pytest.raises(UnsupportedModelError, match="'gpt_bigcode'.*supported: opt, llama"):
        load_model_spec(tmp_path)


def test_unsupported_rope_scaling_is_named(tmp_path):
    d = make_checkpoint(tmp_path / "m", "llama_tied")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="'dynamic'"):
        load_model_spec(d)


def test_missing_layer_weights_are_named(checkpoint, tmp_path):
    d = tmp_path / "cut"
    shutil.copytree(checkpoint("llama_tied"), d)
    weights = load_file(d / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k}, d / "model.safetensors")
    with pytest.raises(WeightFormatError, match=r"lack layers \[1\]"):
        Engine.load(d)


def test_a_tokenizer_that_needs_the_folders_code_is_refused_and_the_code_never_runs(checkpoint, tmp_path,
                                                                                    monkeypatch):
    import io

    from engine.tokenizer import load_tokenizer

    model = tmp_path / "model"
    shutil.copytree(checkpoint("llama_tied"), model)
    marker = tmp_path / "ran"
    (model / "custom_tok.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                         "from transformers import PreTrainedTokenizerFast\n"
                                         "class CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": [None, "custom_tok.CustomTokenizer"]})
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 4))  # a yes to any prompt
    with pytest.raises(UnsupportedModelError, match="never runs a checkpoint's code"):
        load_tokenizer(model)
    assert not marker.exists()


def test_a_file_named_safetensors_that_is_not_one_is_refused_in_one_line(checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(checkpoint("llama_tied"), model)
    (model / "model.safetensors").write_bytes(b"PK\x03\x04 this is a zip archive, not safetensors" * 10)
    with pytest.raises(WeightFormatError, match=r"model.safetensors.* is not a safetensors file"):
        load_model_spec(model)
