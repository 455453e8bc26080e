"""The checkpoint's own tokenizer, loaded from local files only. A checkpoint's own Python code never runs:
transformers is told `trust_remote_code=False`, so it neither imports the folder's modules nor asks whether
to (a folder that needs them is refused with one line)."""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelNotFoundError, UnsupportedModelError


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "trust_remote_code" in str(e) or "custom code" in str(e):
            raise UnsupportedModelError(
                f"the tokenizer in {str(model_dir)!r} needs the folder's own Python code (auto_map in its "
                "tokenizer_config.json or config.json); flexbatch never runs a checkpoint's code: use a "
                "checkpoint whose tokenizer transformers provides (tokenizer.json)") from e
        raise ModelNotFoundError(
            f"no usable tokenizer in {str(model_dir)!r} ({e.__class__.__name__}: {first}); "
            "the folder needs tokenizer.json or the tokenizer files saved by save_pretrained"
        ) from e
