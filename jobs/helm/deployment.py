"""The flexbatch model deployment for HELM (HELM's `model_deployments.yaml` mechanism): `helm-run
--local-path DIR` reads DIR/model_deployments.yaml, model_metadata.yaml and tokenizer_configs.yaml, so writing
an entry named `flexbatch/<model folder>` there lets a run entry say `model=flexbatch/<model folder>`. Its client
(jobs/helm/client.py) answers from a `helm-batch` store; its tokenizer is the checkpoint's own (HELM's
HuggingFaceTokenizer on the folder), and its context the checkpoint's, so HELM's adapters fit prompts as the
engine counts them. Only the text of that entry is written: the rest of each file (other entries, comments,
quoting) stays as the user wrote it.
"""

from __future__ import annotations

from pathlib import Path

from jobs.helm.yaml_entry import set_list_entries

CLIENT = "jobs.helm.client.FlexbatchClient"
HF_TOKENIZER = "helm.tokenizers.huggingface_tokenizer.HuggingFaceTokenizer"


def deployment_name(model_dir: Path) -> str:
    return f"flexbatch/{Path(model_dir).name}"


def write_deployment(local_path: Path, model_dir: Path, store: Path) -> str:
    """Write (or replace) the deployment, model and tokenizer entries of `model_dir`; returns the name."""
    from engine.spec import load_model_spec
    from engine.tokenizer import load_tokenizer

    name, model_dir = deployment_name(model_dir), Path(model_dir).resolve()
    tokenizer = load_tokenizer(model_dir)
    context = load_model_spec(model_dir).max_position_embeddings
    entries = {
        "model_deployments.yaml": ("model_deployments", {
            "name": name, "model_name": name, "tokenizer_name": name, "max_sequence_length": context,
            "client_spec": {"class_name": CLIENT, "args": {"store": str(Path(store).resolve())}}}),
        "model_metadata.yaml": ("models", {
            "name": name, "display_name": model_dir.name, "description": f"{model_dir}, run by flexbatch",
            "creator_organization_name": "flexbatch", "access": "open",
            "tags": ["TEXT_MODEL_TAG", "FULL_FUNCTIONALITY_TEXT_MODEL_TAG"]}),
        "tokenizer_configs.yaml": ("tokenizer_configs", {
            "name": name, "tokenizer_spec": {"class_name": HF_TOKENIZER,
                                             "args": {"pretrained_model_name_or_path": str(model_dir)}},
            "end_of_text_token": tokenizer.eos_token or "", "prefix_token": tokenizer.bos_token or ""}),
    }
    Path(local_path).mkdir(parents=True, exist_ok=True)
    set_list_entries([(Path(local_path) / file, section, entry) for file, (section, entry) in entries.items()])
    return name
