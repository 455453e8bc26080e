"""Weights from safetensors files, addressed per layer so that each layer can live on its own tier and be
loaded on demand. Keys inside a layer keep the checkpoint's names after `layers.{i}.`
(e.g. `self_attn.q_proj.weight`); global keys drop the family prefix (`model.`, `model.decoder.`, `decoder.`, and a
multimodal checkpoint's language model's: `language_model.model.`, `model.language_model.`). The other towers of a
multimodal checkpoint (vision, projector) are not read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import WeightFormatError
from engine.quantized.config import checkpoint_quantization
from engine.quantized.layer import dense_weights
from engine.spec import ModelSpec, check_safetensors, read_config

LayerWeights = dict[str, torch.Tensor]
_PREFIXES = ("model.decoder.", "language_model.model.", "model.language_model.", "language_model.", "model.",
             "decoder.")
_LAYER_KEY = re.compile(rf"^(?:{'|'.join(map(re.escape, _PREFIXES))})?layers\.(\d+)\.(.+)$")
OTHER_TOWERS = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _split_key(key: str) -> tuple[int | None, str] | None:
    """(layer index or None for a global, the name within it), or None for a key of another tower."""
    if key.startswith(OTHER_TOWERS):
        return None
    m = _LAYER_KEY.match(key)
    if m:
        return int(m.group(1)), m.group(2)
    for p in _PREFIXES:
        if key.startswith(p):
            return None, key[len(p):]
    return None, key


class CheckpointReader:
    """Index of a (possibly sharded) safetensors checkpoint: which file holds which tensor. Reads nothing
    until asked; `layer(i)` returns one layer's tensors, `globals()` the embeddings, final norm and head."""

    def __init__(self, model_dir: str | Path, spec: ModelSpec):
        self.spec = spec
        self.dir = Path(model_dir)
        # GPTQ/AWQ/FP8 (engine/quantized/): read as stored, dequantized one layer at a time; others refused here
        self.quant = checkpoint_quantization(read_config(self.dir), self.dir / "config.json")
        self._where: dict[tuple[int | None, str], tuple[Path, str]] = {}
        for f in _weight_files(self.dir):
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    where = _split_key(key)
                    if where is not None:
                        self._where[where] = (f, key)
        self._check_layers()

    def _check_layers(self) -> None:
        n = self.spec.num_layers
        present = {i for i, _ in self._where if i is not None}
        missing = sorted(set(range(n)) - present)
        if missing:
            raise WeightFormatError(
                f"{str(self.dir)!r}: config.json says num_hidden_layers={n} but the weights lack layers {missing[:5]}"
            )

    def _read(self, items: list[tuple[str, tuple[Path, str]]], dtype: torch.dtype | None) -> LayerWeights:
        """The tensors at `items` in `dtype` (None: as stored), a quantized checkpoint's weights dequantized."""
        if dtype is not None and self.quant is not None:
            return dense_weights(self._read(items, None), self.quant, dtype)
        out: LayerWeights = {}
        by_file: dict[Path, list[tuple[str, str]]] = {}
        for name, (f, key) in items:
            by_file.setdefault(f, []).append((name, key))
        for f, pairs in by_file.items():
            with safe_open(str(f), framework="pt") as sf:
                for name, key in pairs:
                    t = sf.get_tensor(key)
                    out[name] = t if dtype is None else t.to(dtype).contiguous()
        return out

    def layer_sources(self, i: int) -> dict[str, tuple[Path, str]]:
        """Where each of layer i's tensors is stored: its name -> (file, key in that file). The disk tier reads a
        layer straight from these files when it would store their bytes unchanged."""
        return {name: loc for (li, name), loc in self._where.items() if li == i}

    def layer(self, i: int, dtype: torch.dtype) -> LayerWeights:
        return self._read(list(self.layer_sources(i).items()), dtype)

    def stored_layer(self, i: int) -> LayerWeights:
        """Layer i's tensors as stored (a quantized checkpoint's packed parts under their own names)."""
        return self._read(list(self.layer_sources(i).items()), None)

    def globals(self, dtype: torch.dtype) -> LayerWeights:
        items = [(name, loc) for (li, name), loc in self._where.items() if li is None]
        return self._read(items, dtype)

def _weight_files(model_dir: Path) -> list[Path]:
    """The files named by `model.safetensors.index.json` when present, else every *.safetensors file."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise WeightFormatError(f"{str(index)!r} is not a valid safetensors index: {e}") from e
        files = [model_dir / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise WeightFormatError(f"shards named in {str(index)!r} are missing: {', '.join(missing[:3])}")
        return files
    return check_safetensors(model_dir)


def require(w: LayerWeights, name: str, where: str) -> torch.Tensor:
    try:
        return w[name]
    except KeyError:
        raise WeightFormatError(f"weight {name!r} of {where} is missing from the checkpoint") from None
