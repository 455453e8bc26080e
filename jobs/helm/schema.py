"""HELM's schema for a suite: what `helm-summarize --schema-path` needs to put the suite's runs in its group
tables. The package ships `schema_flexbatch.yaml` (the bundled scenarios); each suite folder gets a copy that
also defines a run group for every other group its runs name (a scenario file's name, or the groups of a HELM
run re-run from its scenario_state.json), gathered under the parent group `flexbatch_files`, each with its
run's first metric as the main one.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_FILE = "schema_flexbatch.yaml"
PACKAGE_SCHEMA = Path(__file__).with_name(SCHEMA_FILE)
FILES_GROUP = "flexbatch_files"
METRIC_GROUPS = ["accuracy", "efficiency", "general_information"]


def read_package_schema() -> dict:
    import yaml

    return yaml.safe_load(PACKAGE_SCHEMA.read_text())


def suite_schema(groups: dict[str, str]) -> dict:
    """The package schema plus a run group for each of `groups` (group name -> main metric) it lacks."""
    schema = read_package_schema()
    known = {g["name"] for g in schema["run_groups"]}
    extra = [(name, metric) for name, metric in groups.items() if name not in known]
    if extra:
        schema["run_groups"].append({
            "name": FILES_GROUP, "display_name": "Other scenarios", "category": "All scenarios",
            "description": "Scenario files and re-run HELM runs of this suite.",
            "subgroups": [name for name, _ in extra]})
        for name, metric in extra:
            schema["run_groups"].append({
                "name": name, "display_name": name, "description": f"The runs of group {name}.",
                "metric_groups": list(METRIC_GROUPS), "environment": {"main_name": metric, "main_split": "test"}})
    return schema


def run_groups(run_dirs: list[Path]) -> dict[str, str]:
    """The groups named by the runs' run_spec.json, each with the run's first metric (exact_match if none;
    bits_per_byte for language modelling)."""
    import json

    groups: dict[str, str] = {}
    for run_dir in run_dirs:
        try:
            spec = json.loads((run_dir / "run_spec.json").read_text())
        except (OSError, ValueError):
            continue  # a failed run writes no HELM files
        names = [n for m in spec.get("metric_specs") or [] for n in (m.get("args") or {}).get("names") or []]
        scored = (spec.get("adapter_spec") or {}).get("method") == "language_modeling"
        for group in spec.get("groups") or []:
            groups.setdefault(group, names[0] if names else "bits_per_byte" if scored else "exact_match")
    return groups


def write_suite_schema(suite_dir: Path, groups: dict[str, str]) -> Path:
    """Write the suite's schema into its folder, atomically; returns its path (for `helm-summarize
    --schema-path`)."""
    import yaml

    suite_dir.mkdir(parents=True, exist_ok=True)
    path = suite_dir / SCHEMA_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(suite_schema(groups), sort_keys=False))
    tmp.replace(path)
    return path
