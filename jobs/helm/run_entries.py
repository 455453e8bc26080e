"""The benchmark spec (`flexbatch helm --spec`): a YAML file of run entries, read into frozen dataclasses and
checked before any model is loaded. Every error names the entry and field, the bad value, and the fix.

    defaults:                       # optional: fields shared by every entry (an entry's adapter keys win)
      adapter: {method: generation, max_tokens: 8, stop_sequences: ["\\n"], temperature: 0, num_outputs: 1}
      metrics: [exact_match, quasi_exact_match]
    entries:
      - scenario: addition          # a built-in scenario, or a .jsonl / .parquet file of instances
        model: demo                 # "demo" (the default) or a checkpoint folder
        adapter: {max_train_instances: 5}
      - scenario_state: run/scenario_state.json   # the requests of a HELM run, re-run with our engine
        name: my-run                # optional: the run's folder name

Relative paths are relative to the spec file's folder. `adapter` takes HELM's AdapterSpec field names, with
HELM's defaults.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from helm.benchmark.adaptation import adapter_spec as helm_adapter_spec

from engine.options import OptionError, options_of
from engine.policy import Policy
from jobs.helm.echo_requests import SCORING_METHODS
from jobs.helm.errors import SpecError
from jobs.helm.metrics import METRICS
from jobs.helm.scenarios import BUILTIN, EVAL_SPLITS, resolve_scenario

METHODS = ("generation", "multiple_choice_joint", *SCORING_METHODS)
DEMO_MODEL = "demo"
# the policy fields an entry may pin (as --compress-weight and --compress-cache pin them for every entry), declared
# on Policy (engine/policy.py)
ENTRY_PINS = {name: options_of(Policy)[name] for name in ("compress_weight", "compress_cache")}
ENTRY_FIELDS = ("name", "scenario", "scenario_state", "model", "adapter", "metrics", "chance", *ENTRY_PINS)


@dataclass(frozen=True)
class AdapterSpec(helm_adapter_spec.AdapterSpec):
    """HELM's AdapterSpec (how instances become prompts and how each prompt is decoded), checked: a bad field is a
    user error naming it. Defaults are HELM's, except `method`, which HELM leaves empty."""

    method: str = "generation"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            _bad("method", self.method, f"one of {', '.join(METHODS)}")
        if self.method in SCORING_METHODS:  # the prompt is scored, nothing generated (HELM's run specs set these)
            object.__setattr__(self, "max_tokens", 0)
            if self.method == "language_modeling":
                object.__setattr__(self, "max_train_instances", 0)
                object.__setattr__(self, "num_train_trials", 1)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in (str, "str") and not isinstance(value, str):
                _bad(f.name, value, "a string (quote it in YAML, e.g. \"\\n\")")
        self._check_numbers()
        self._check_lists()
        if self.method == "multiple_choice_joint" and not any(ch.isalnum() for ch in self.reference_prefix):
            _bad("reference_prefix", self.reference_prefix, "a prefix with a letter, such as \"A. \"")

    def _check_numbers(self) -> None:
        tokens = 0 if self.method in SCORING_METHODS else 1
        for name, low in (("max_train_instances", 0), ("num_outputs", 1), ("num_train_trials", 1), ("max_tokens", tokens)):
            if not _is_int(getattr(self, name)) or getattr(self, name) < low:
                _bad(name, getattr(self, name), f"an integer >= {low}")
        if self.max_eval_instances is not None and (not _is_int(self.max_eval_instances) or self.max_eval_instances < 1):
            _bad("max_eval_instances", self.max_eval_instances, "a positive integer, or leave it out for all")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            _bad("temperature", t, "a number >= 0 (0 is greedy)")
        for name in ("sample_train", "multi_label"):
            if not isinstance(getattr(self, name), bool):
                _bad(name, getattr(self, name), "true or false")
        if self.random is not None and not isinstance(self.random, str):
            _bad("random", self.random, "a string")

    def _check_lists(self) -> None:
        stops = self.stop_sequences
        if isinstance(stops, str) or not all(isinstance(s, str) and s for s in stops):
            _bad("stop_sequences", stops, "a list of non-empty strings, e.g. [\"\\n\"]")
        object.__setattr__(self, "stop_sequences", tuple(stops))
        if self.eval_splits is not None:
            if isinstance(self.eval_splits, str) or not set(self.eval_splits) <= set(EVAL_SPLITS):
                _bad("eval_splits", self.eval_splits, f"a list of {' and/or '.join(EVAL_SPLITS)}")
            object.__setattr__(self, "eval_splits", tuple(self.eval_splits))

    @property
    def splits_evaluated(self) -> tuple[str, ...]:
        return self.eval_splits or EVAL_SPLITS

    def to_helm(self) -> dict:
        """As HELM writes it (run_spec.json, scenario_state.json)."""
        from jobs.helm.helm_objects import to_json

        return to_json(self)


# the fields a spec may set: those HELM's generation and multiple_choice_joint adapters read, that flexbatch runs
ADAPTER_FIELDS = ("method", "global_prefix", "global_suffix", "instructions", "input_prefix", "input_suffix",
                  "reference_prefix", "reference_suffix", "output_prefix", "output_suffix", "instance_prefix",
                  "max_train_instances", "max_eval_instances", "num_outputs", "num_train_trials", "sample_train",
                  "model_deployment", "model", "temperature", "max_tokens", "stop_sequences", "random",
                  "multi_label", "eval_splits")


@dataclass(frozen=True)
class RunEntry:
    """One run: a scenario (built-in name or file path) or a HELM scenario_state.json, a model folder, the
    adapter, and the metrics. `chance` is the score of guessing, when known (shown in the summary)."""

    model: Path
    scenario: str = ""
    scenario_state: Path | None = None
    name: str = ""
    adapter: AdapterSpec = field(default_factory=AdapterSpec)
    metrics: tuple[str, ...] = ()
    chance: float | None = None
    compress_weight: bool = ENTRY_PINS["compress_weight"].default
    compress_cache: bool = ENTRY_PINS["compress_cache"].default

    def __post_init__(self) -> None:
        if bool(self.scenario) == (self.scenario_state is not None):
            raise SpecError("give exactly one of scenario (a built-in name or a file of instances) and "
                            "scenario_state (a HELM scenario_state.json)")
        metrics = (self.metrics,) if isinstance(self.metrics, str) else tuple(self.metrics)
        unknown = [m for m in metrics if not isinstance(m, str) or m not in METRICS]
        if unknown:
            raise SpecError(f"metrics: unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
        object.__setattr__(self, "metrics", metrics)
        if self.chance is not None and (not isinstance(self.chance, (int, float)) or not 0 <= self.chance <= 1):
            raise SpecError(f"chance={self.chance!r} is invalid: expected a number in [0, 1]")
        if not isinstance(self.name, str) or "\n" in self.name or self.name in (".", ".."):
            raise SpecError(f"name={self.name!r} is invalid: expected a folder name")
        object.__setattr__(self, "name", self.name.replace("/", "_"))
        for name, pin in ENTRY_PINS.items():
            try:
                pin.check(getattr(self, name))
            except OptionError as e:
                raise SpecError(f"{name}={e.value!r} is invalid: expected {pin.expected().lower()}") from None

    @property
    def scenario_label(self) -> str:
        if self.scenario_state is not None:
            return self.scenario_state.parent.name
        return self.scenario if self.scenario in BUILTIN else Path(self.scenario).stem

    @property
    def run_name(self) -> str:
        """The run's folder name: `name`, or HELM's style `<scenario>:model=<model folder>[,compress=...]`."""
        if self.name:
            return self.name
        head, _, args = self.scenario_label.partition(":")
        kept = [a for a in args.split(",") if a and not a.startswith("model=")] + [f"model={self.model.name}"]
        compress = "+".join(k for k in ("weight", "cache") if getattr(self, f"compress_{k}"))
        if compress:
            kept.append(f"compress={compress}")
        return f"{head}:{','.join(kept)}".replace("/", "_")


@dataclass(frozen=True)
class HelmSpec:
    path: Path | None
    entries: tuple[RunEntry, ...]

    def __post_init__(self) -> None:
        where = self.path or "the command line"
        if not self.entries:
            raise SpecError(f"{where}: no entries; list the runs under `entries:`")
        names = [e.run_name for e in self.entries]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise SpecError(f"{where}: entries[{names.index(name)}] and entries[{i}] are both run {name!r}; "
                                "give one of them another `name`")


def check_suite(suite) -> str:
    """A suite is a folder under runs/: one plain name, never a path that leaves that folder."""
    if not isinstance(suite, str) or not suite or "/" in suite or suite in (".", ".."):
        raise SpecError(f"--suite {suite!r} is invalid: expected a folder name such as v1")
    return suite


def _bad(name: str, value, expected: str) -> None:
    raise SpecError(f"adapter.{name}={value!r} is invalid: expected {expected}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_spec(path: Path | str) -> HelmSpec:
    """Read and check a YAML spec; raises `SpecError` naming the entry and field of the first problem."""
    import yaml

    path = Path(path).expanduser()
    if not path.is_file():
        raise SpecError(f"--spec {path}: no such file; give a YAML spec such as examples/helm/demo.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SpecError(f"{path} is not valid YAML ({' '.join(str(e).split())}); fix its syntax") from e
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SpecError(f"{path}: expected a mapping with a list of runs under `entries:` (and optional `defaults:`)")
    unknown = sorted(set(data) - {"entries", "defaults"})
    if unknown:
        raise SpecError(f"{path}: unknown top-level field {unknown[0]!r}; expected entries and defaults")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or "name" in defaults:
        raise SpecError(f"{path}: defaults must be a mapping of entry fields other than name")
    entries = []
    for i, raw in enumerate(data["entries"]):
        try:
            entries.append(entry_from_dict(_merged(defaults, raw), path.parent))
        except SpecError as e:
            raise SpecError(f"{path}: entries[{i}]: {e}") from None
    return HelmSpec(path=path, entries=tuple(entries))


def entry_from_dict(raw, base: Path) -> RunEntry:
    """One run entry from its YAML mapping; paths are relative to `base`."""
    if not isinstance(raw, dict):
        raise SpecError(f"expected a mapping of {', '.join(ENTRY_FIELDS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(ENTRY_FIELDS))
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r}; entry fields: {', '.join(ENTRY_FIELDS)}")
    adapter = raw.get("adapter") or {}
    if not isinstance(adapter, dict):
        raise SpecError(f"adapter must be a mapping of AdapterSpec fields, got {adapter!r}")
    unknown = sorted(set(adapter) - set(ADAPTER_FIELDS))
    if unknown:
        raise SpecError(f"adapter: unknown field {unknown[0]!r}; supported AdapterSpec fields: "
                        f"{', '.join(ADAPTER_FIELDS)}")
    state = raw.get("scenario_state")
    if state is not None and not (base / str(state)).expanduser().is_file():
        raise SpecError(f"scenario_state file {base / str(state)} does not exist; give a path relative to the "
                        "spec file's folder")
    return RunEntry(
        model=resolve_model(raw.get("model"), base),
        scenario=resolve_scenario(raw["scenario"], base) if "scenario" in raw else "",
        scenario_state=(base / str(state)).expanduser().resolve() if state is not None else None,
        name=str(raw.get("name") or ""), adapter=AdapterSpec(**adapter),
        metrics=raw.get("metrics") or (), chance=raw.get("chance"),
        **{name: raw.get(name, pin.default) for name, pin in ENTRY_PINS.items()})


def resolve_model(value, base: Path) -> Path:
    """`demo` (or nothing): the demo checkpoint in examples/; otherwise a checkpoint folder."""
    if value is None or value == DEMO_MODEL:
        from jobs.common import demo_model_dir

        path = demo_model_dir()
    elif isinstance(value, str) and value:
        path = (base / value).expanduser().resolve()
    else:
        raise SpecError(f"model={value!r} is invalid: expected \"demo\" or a checkpoint folder")
    if not (path / "config.json").is_file():
        raise SpecError(f"model folder {path} has no config.json; give a checkpoint folder (config.json, "
                        "tokenizer, *.safetensors)")
    return path


def with_overrides(spec: HelmSpec, model: Path | None = None, max_eval_instances: int | None = None,
                   compress_weight: bool = False, compress_cache: bool = False) -> HelmSpec:
    """The spec with the command line's choices applied to every entry."""
    entries = []
    for e in spec.entries:
        adapter = e.adapter
        if max_eval_instances is not None:
            adapter = dataclasses.replace(adapter, max_eval_instances=max_eval_instances)
        entries.append(dataclasses.replace(
            e, adapter=adapter, model=resolve_model(str(model), Path.cwd()) if model else e.model,
            compress_weight=e.compress_weight or compress_weight, compress_cache=e.compress_cache or compress_cache))
    return HelmSpec(path=spec.path, entries=tuple(entries))


def _merged(defaults: dict, raw) -> dict:
    if not isinstance(raw, dict):
        return raw
    out = {**defaults, **raw}
    if isinstance(defaults.get("adapter"), dict) and isinstance(raw.get("adapter"), dict):
        out["adapter"] = {**defaults["adapter"], **raw["adapter"]}
    return out
