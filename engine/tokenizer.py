"""The checkpoint's own tokenizer, loaded from local files only."""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelNotFoundError


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"no usable tokenizer in {str(model_dir)!r} ({e.__class__.__name__}: {str(e).splitlines()[0]}); "
            "the folder needs tokenizer.json or the tokenizer files saved by save_pretrained"
        ) from e
