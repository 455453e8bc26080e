"""`Policy`: how the engine runs a workload. FlexGen's block schedule and placement (batch sizes, fractions of
weights / KV cache / activations on the gpu, cpu and disk tiers, 4-bit compression, CPU attention) plus
FlexInfer's per-phase compute choice: CPU-only, GPU with offloading, or a static split by layers."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields

from engine.errors import InvalidParamsError
from engine.options import Flag, Option, check_fields, option

TIERS = ("gpu", "cpu", "disk")
PHASE_DEVICES = ("cpu", "gpu", "split")
# compressed weights: FlexGen's group-wise 4-bit, row-wise 8-bit, or bfloat16 at rest (computed in the run's dtype:
# lossless for a bf16 checkpoint computing in float32, half the bytes to store and read)
WEIGHT_FORMATS = ("int4", "int8", "bf16")
DEFAULT_GBS = 8
DEFAULT_NUM_GB = 2
FRACTION_NAMES = ("weight_gpu", "weight_cpu", "cache_gpu", "cache_cpu", "act_gpu", "act_cpu")  # --percent's order
# every policy field is a pin of the command line, of flexbatch.run (pins=) and of lm-eval's model_args
_WHOLE = ("ray", "the stage runs a whole Policy (policy=) or plans one from its first batch")

_SHORTHAND = "a command-line shorthand; pin the fields it stands for"


def _fraction(default: float, what: str):
    return option(default, kind="number", low=0, high=1, via="--percent", absent=(_WHOLE,),
                  help=f"The share of {what} (0 to 1); the rest of each kind goes to disk.")


@dataclass(frozen=True)
class Policy:
    """Fractions on `gpu` and `cpu`; the rest of each kind lives on `disk`. For a phase on `split`, layers
    below `*_split_layer` run on the CPU and the others on the GPU. With `refill`, a finished row's slot takes
    the next waiting row (engine/loop/refill.py) instead of idling until its block ends. With `share_prefix`, the
    leading tokens every row of a block shares are computed and cached once (engine/loop/shared_prefix.py)."""

    gbs: int = option(DEFAULT_GBS, kind="int", low=1, absent=(_WHOLE,),
                      flag=Flag("--gbs", checked=True, default=None,
                                default_text=f"planned; {DEFAULT_GBS} with --no-plan"),
                      help="GPU batch size: rows computed together.")
    num_gb: int = option(DEFAULT_NUM_GB, kind="int", low=1, absent=(_WHOLE,),
                         flag=Flag("--num-gb", checked=True, default=None,
                                   default_text=f"planned; {DEFAULT_NUM_GB} with --no-plan"),
                         help="GPU batches per block; a layer's weights are loaded once per block.")
    weight_gpu: float = _fraction(0.0, "the weights on the GPU")
    weight_cpu: float = _fraction(1.0, "the weights in CPU memory")
    cache_gpu: float = _fraction(0.0, "the KV cache on the GPU")
    cache_cpu: float = _fraction(1.0, "the KV cache in CPU memory")
    act_gpu: float = _fraction(0.0, "the activations on the GPU")
    act_cpu: float = _fraction(1.0, "the activations in CPU memory")
    compress_weight: bool = option(False, kind="bool", absent=(_WHOLE,),
                                   flag=Flag("--compress-weight", words=tuple((w, True) for w in WEIGHT_FORMATS),
                                             word_field="weight_format", flag_value="int4", default=None),
                                   help="Compressed weights: int4 (the default when given alone: 4-bit group-wise, "
                                        "group 64), int8 (row-wise, int8 x int8 GEMMs; the LM head in int8 too) or "
                                        "bf16 (kept and read in bfloat16, computed in float32: lossless for a bf16 "
                                        "checkpoint, half the bytes of float32).")
    compress_cache: bool = option(False, kind="bool", absent=(_WHOLE,), flag=Flag("--compress-cache"),
                                  help="4-bit group-wise KV cache (group 64).")
    weight_format: str = option("int4", kind="choice", choices=WEIGHT_FORMATS, via="--compress-weight",
                                absent=(_WHOLE,), help="The format of compressed weights (with compress_weight).")
    cpu_attention: bool = option(True, kind="bool", absent=(_WHOLE,),
                                 flag=Flag("--cpu-attention/--no-cpu-attention"),
                                 help="Decode attention runs where the KV cache lives.")
    prefill_device: str = option("cpu", kind="choice", choices=PHASE_DEVICES, absent=(_WHOLE,),
                                 flag=Flag("--prefill-device"),
                                 help="Where prefill computes; split = CPU below --prefill-split-layer.")
    decode_device: str = option("cpu", kind="choice", choices=PHASE_DEVICES, absent=(_WHOLE,),
                                flag=Flag("--decode-device"),
                                help="Where decode computes; split = CPU below --decode-split-layer.")
    prefill_split_layer: int = option(0, kind="int", low=0, absent=(_WHOLE,),
                                      flag=Flag("--prefill-split-layer", checked=True),
                                      help="First layer computed on the GPU in prefill when --prefill-device split.")
    decode_split_layer: int = option(0, kind="int", low=0, absent=(_WHOLE,),
                                     flag=Flag("--decode-split-layer", checked=True),
                                     help="First layer computed on the GPU in decode when --decode-device split.")
    refill: bool = option(False, kind="bool", absent=(_WHOLE,),
                          flag=Flag("--refill", words=(("auto", None), ("on", True), ("off", False)), default="auto"),
                          help="Finished rows' slots take waiting rows: auto lets the planner decide from the rows' "
                               "max_new_tokens and stop strings, then from what rows really generate; off with "
                               "--no-plan unless on.")
    share_prefix: bool = option(True, kind="bool", absent=(_WHOLE,),
                                flag=Flag("--prefix-sharing", words=(("auto", None), ("off", False)), default="auto"),
                                help="The leading tokens every row of a block shares (a few-shot prompt's "
                                     "instructions and examples, a chat's system prompt) are computed and cached "
                                     "once, and each row holds only its own tokens: blocks hold more rows and prefill "
                                     "skips the repeats. auto: where rows share at least 32 tokens; off: every row's "
                                     "prompt is computed whole.")
    weight_disk: float = field(init=False)
    cache_disk: float = field(init=False)
    act_disk: float = field(init=False)

    def __post_init__(self) -> None:
        check_fields(self)
        for kind in ("weight", "cache", "act"):
            rest = 1.0 - getattr(self, f"{kind}_gpu") - getattr(self, f"{kind}_cpu")
            if rest < -1e-9:
                raise InvalidParamsError(
                    f"{kind}: gpu {getattr(self, f'{kind}_gpu')} + cpu {getattr(self, f'{kind}_cpu')} exceeds 1; "
                    "the two fractions must sum to at most 1 (the rest goes to disk)")
            object.__setattr__(self, f"{kind}_disk", max(0.0, round(rest, 9)))
        for phase in ("prefill", "decode"):
            self._check_phase(phase)

    def _check_phase(self, phase: str) -> None:
        device, split = getattr(self, f"{phase}_device"), getattr(self, f"{phase}_split_layer")
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


# the command line's shorthands for policy fields
BATCH_SIZE = Option("batch_size", kind="int", low=1, flag=Flag("--batch-size", checked=True),
                    absent=tuple((surface, f"{_SHORTHAND} (gbs=N, num_gb=1)")
                                 for surface in ("python", "ray", "model_args")),
                    help="Shorthand for --gbs N --num-gb 1.")
PERCENT = Option("percent", kind="number",
                 flag=Flag("--percent", metavar="WG WC CG CC HG HC", nargs=6,
                           default_text="planned; 0 100 0 100 0 100 with --no-plan"),
                 absent=tuple((surface, f"{_SHORTHAND} ({', '.join(FRACTION_NAMES)}: 0 to 1)")
                              for surface in ("python", "ray", "model_args")),
                 help="FlexGen's placement: percent of weights, KV cache and activations on the gpu and on the cpu; "
                      "the rest goes to disk.")


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
