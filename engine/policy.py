"""`Policy`: how the engine runs a workload. FlexGen's block schedule and placement (batch sizes, fractions of
weights / KV cache / activations on the gpu, cpu and disk tiers, 4-bit compression, CPU attention) plus
FlexInfer's per-phase compute choice: CPU-only, GPU with offloading, or a static split by layers."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields

from engine.errors import InvalidParamsError

TIERS = ("gpu", "cpu", "disk")
PHASE_DEVICES = ("cpu", "gpu", "split")
# compressed weights: FlexGen's group-wise 4-bit, row-wise 8-bit, or bfloat16 at rest (computed in the run's dtype:
# lossless for a bf16 checkpoint computing in float32, half the bytes to store and read)
WEIGHT_FORMATS = ("int4", "int8", "bf16")
DEFAULT_GBS = 8
DEFAULT_NUM_GB = 2
FRACTION_NAMES = ("weight_gpu", "weight_cpu", "cache_gpu", "cache_cpu", "act_gpu", "act_cpu")  # --percent's order


@dataclass(frozen=True)
class Policy:
    """Fractions on `gpu` and `cpu`; the rest of each kind lives on `disk`. For a phase on `split`, layers
    below `*_split_layer` run on the CPU and the others on the GPU. With `refill`, a finished row's slot takes
    the next waiting row (engine/loop/refill.py) instead of idling until its block ends. With `share_prefix`, the
    leading tokens every row of a block shares are computed and cached once (engine/loop/shared_prefix.py)."""

    gbs: int = DEFAULT_GBS
    num_gb: int = DEFAULT_NUM_GB
    weight_gpu: float = 0.0
    weight_cpu: float = 1.0
    cache_gpu: float = 0.0
    cache_cpu: float = 1.0
    act_gpu: float = 0.0
    act_cpu: float = 1.0
    compress_weight: bool = False
    compress_cache: bool = False
    weight_format: str = "int4"  # the format of compressed weights (with compress_weight)
    cpu_attention: bool = True
    prefill_device: str = "cpu"
    decode_device: str = "cpu"
    prefill_split_layer: int = 0
    decode_split_layer: int = 0
    refill: bool = False
    share_prefix: bool = True
    weight_disk: float = field(init=False)
    cache_disk: float = field(init=False)
    act_disk: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("gbs", "num_gb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParamsError(f"{name}={value!r} is invalid: use a positive integer")
        for name in FRACTION_NAMES:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InvalidParamsError(f"{name}={value!r} is invalid: a fraction must lie in [0, 1]")
        for kind in ("weight", "cache", "act"):
            rest = 1.0 - getattr(self, f"{kind}_gpu") - getattr(self, f"{kind}_cpu")
            if rest < -1e-9:
                raise InvalidParamsError(
                    f"{kind}: gpu {getattr(self, f'{kind}_gpu')} + cpu {getattr(self, f'{kind}_cpu')} exceeds 1; "
                    "the two fractions must sum to at most 1 (the rest goes to disk)")
            object.__setattr__(self, f"{kind}_disk", max(0.0, round(rest, 9)))
        if self.weight_format not in WEIGHT_FORMATS:
            raise InvalidParamsError(f"weight_format={self.weight_format!r} is invalid: use one of "
                                     f"{', '.join(WEIGHT_FORMATS)}")
        for phase in ("prefill", "decode"):
            self._check_phase(phase)

    def _check_phase(self, phase: str) -> None:
        device, split = getattr(self, f"{phase}_device"), getattr(self, f"{phase}_split_layer")
        if device not in PHASE_DEVICES:
            raise InvalidParamsError(f"{phase}_device={device!r} is invalid: use one of {', '.join(PHASE_DEVICES)}")
        if isinstance(split, bool) or not isinstance(split, int) or split < 0:
            raise InvalidParamsError(f"{phase}_split_layer={split!r} is invalid: use a layer index >= 0")
        if device == "split" and split == 0:
            raise InvalidParamsError(f"{phase}_device='split' needs {phase}_split_layer >= 1 (the first GPU layer)")

    @property
    def block_size(self) -> int:
        return self.gbs * self.num_gb

    def uses_gpu(self) -> bool:
        on_gpu = self.weight_gpu + self.cache_gpu + self.act_gpu > 0
        return on_gpu or self.prefill_device != "cpu" or self.decode_device != "cpu"

    def weights_stay(self) -> bool:
        """Whether every weight stays where it computes, so that a block costs no weight traffic however few rows it
        holds: all of them in CPU memory and nothing on the GPU."""
        return self.weight_cpu == 1.0 and not self.uses_gpu()

    def layer_on_gpu(self, phase: str, layer: int) -> bool:
        """Whether `layer` computes on the GPU in `phase` ("prefill" or "decode")."""
        device = getattr(self, f"{phase}_device")
        return device == "gpu" or (device == "split" and layer >= getattr(self, f"{phase}_split_layer"))

    def fixed_at_load(self, num_layers: int) -> dict:
        """What an engine fixes when it loads under this policy: the weights' tiers and format, the KV cache's
        compression, and which of its `num_layers` layers ever compute on the GPU (their weights are packed or
        staged for it). Every other field (block shape, refill, KV cache and activation placement, CPU
        attention) may change from one call of a loaded engine to the next."""
        return {"weight_gpu": self.weight_gpu, "weight_cpu": self.weight_cpu,
                "compress_weight": self.compress_weight, "weight_format": self.weight_format,
                "compress_cache": self.compress_cache,
                "gpu_layers": tuple(i for i in range(num_layers)
                                    if self.layer_on_gpu("prefill", i) or self.layer_on_gpu("decode", i))}

    def to_dict(self) -> dict:
        d = asdict(self)
        for kind in ("weight", "cache", "act"):
            d.pop(f"{kind}_disk")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Policy:
        unknown = sorted(set(d) - set(cls.__dataclass_fields__) - {"weight_disk", "cache_disk", "act_disk"})
        if unknown:
            raise InvalidParamsError(f"unknown policy fields {unknown}; known: {sorted(Policy().to_dict())}")
        return cls(**{k: v for k, v in d.items() if not k.endswith("_disk")})

    @classmethod
    def from_json(cls, text: str) -> Policy:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_percent(cls, percent: tuple[float, ...], **kw) -> Policy:
        """FlexGen's `--percent WG WC CG CC HG HC` (0-100 each)."""
        if len(percent) != 6 or any(not 0 <= p <= 100 for p in percent):
            raise InvalidParamsError(f"--percent {percent!r} is invalid: give six numbers in [0, 100]: "
                                     "weights gpu cpu, cache gpu cpu, activations gpu cpu")
        return cls(**{n: p / 100 for n, p in zip(FRACTION_NAMES, percent)}, **kw)


class Pins(Mapping):
    """The part of a policy its user fixed, by Policy field name (a read-only mapping). The planner chooses every
    other field; without planning they take Policy's defaults (`policy()`). This is refill's one encoding as a
    choice: pinned True or False, or absent, where the planner decides (and decides again as rows finish)."""

    def __init__(self, values: Mapping | None = None, /, **more):
        values = {**(values or {}), **more}
        known = tuple(f.name for f in fields(Policy) if f.init)
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InvalidParamsError(f"cannot pin {unknown}: pins name Policy fields ({', '.join(known)})")
        probe = {k: v for k, v in values.items() if k not in FRACTION_NAMES}
        for phase in ("prefill", "decode"):  # a pinned split without its layer: the search picks the layer
            if probe.get(f"{phase}_device") == "split":
                probe.setdefault(f"{phase}_split_layer", 1)
        Policy(**probe)  # each value checked as Policy checks it (fractions together, where they are pinned)
        self._values = values

    @classmethod
    def of(cls, policy: Policy) -> Pins:
        """Every field of `policy` pinned: planning keeps it whole; without planning it runs as it is."""
        return cls(policy.to_dict())

    def __getitem__(self, name: str):
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Pins({self._values!r})"

    def with_(self, **values) -> Pins:
        """These pins with `values` pinned too (replacing the same fields)."""
        return Pins({**self._values, **values})

    def policy(self) -> Policy:
        """The policy without planning: the pinned fields, Policy's defaults for the rest."""
        return Policy(**self._values)


_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str | float | int | None, name: str = "memory") -> float | None:
    """'24GiB', '512MB', '1e9' -> bytes; None or '' -> None (no limit)."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InvalidParamsError(f"{name}={text!r} is not a size; write e.g. 512MiB, 4GiB or 2e9") from None
    if value <= 0:
        raise InvalidParamsError(f"{name}={text!r} must be positive")
    return value
