"""The checkpoint's own tokenizer, loaded from local files only. A checkpoint's own Python code never runs:
transformers is told `trust_remote_code=False`, so it neither imports the folder's modules nor asks whether
to (a folder that needs them is refused with one line).

A tokenizer is loaded once per process and folder (and again only when its files change): the job's checks,
the planner and the engine all ask for it. Where the outcome of `AutoTokenizer` is known from the folder's
JSON files alone (a `tokenizer.json` saved as `TokenizersBackend`, no `auto_map`, a model type whose
tokenizer transformers resolves to that class), that class is loaded directly: `AutoTokenizer` would first
build the model's config, which imports most of transformers' modelling code (a visible share of a small
job's start-up: `flexbatch bench startup`). `tests/engine/test_tokenizer.py` checks both give the same tokenizer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from engine.errors import ModelNotFoundError, UnsupportedModelError

DIRECT_CLASS = "TokenizersBackend"
# model types for which AutoTokenizer returns TokenizersBackend when tokenizer_config.json names it; qwen2 is
# not among them (transformers maps it to Qwen2Tokenizer whatever the folder says)
DIRECT_MODEL_TYPES = ("llama", "mistral", "opt")
_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json",
          "chat_template.jinja")
_lock = threading.Lock()
_loaded: dict[tuple, object] = {}


def load_tokenizer(model_dir: str | Path):
    """The folder's tokenizer, shared by every caller in this process (callers must not modify it)."""
    folder = Path(model_dir).resolve()
    key = (folder, *(_stamp(folder / name) for name in _FILES))
    with _lock:
        if key not in _loaded:
            _loaded[key] = _load(folder, str(model_dir))
        return _loaded[key]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def loads_directly(folder: Path) -> bool:
    """Whether AutoTokenizer's choice for `folder` is DIRECT_CLASS, decided from its JSON files alone."""
    try:
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(tok_cfg, dict) and isinstance(cfg, dict) and tok_cfg.get("tokenizer_class") == DIRECT_CLASS
            and "auto_map" not in tok_cfg and "auto_map" not in cfg and cfg.get("model_type") in DIRECT_MODEL_TYPES
            and (folder / "tokenizer.json").is_file())


def _load(folder: Path, shown: str):
    try:
        if loads_directly(folder):
            from transformers.tokenization_utils_tokenizers import TokenizersBackend

            return TokenizersBackend.from_pretrained(str(folder), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "trust_remote_code" in str(e) or "custom code" in str(e):
            raise UnsupportedModelError(
                f"the tokenizer in {shown!r} needs the folder's own Python code (auto_map in its "
                "tokenizer_config.json or config.json); flexbatch never runs a checkpoint's code: use a "
                "checkpoint whose tokenizer transformers provides (tokenizer.json)") from e
        raise ModelNotFoundError(
            f"no usable tokenizer in {shown!r} ({e.__class__.__name__}: {first}); "
            "the folder needs tokenizer.json or the tokenizer files saved by save_pretrained"
        ) from e
