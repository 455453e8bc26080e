"""What a job checks before any work beyond its inputs and model (pipeline/job.py `prepare_job`): the hardware spec
file it names, its offload folder, and its job-wide answer constraint. Each is refused in one line naming the value
and the fix (a command's exit 2), where it would otherwise stop every shard, or fail every row, once the job ran."""

from __future__ import annotations

from engine.guided import Guided
from engine.memory.offload import checked_offload_root
from engine.spec import ModelSpec
from pipeline.errors import ConfigError
from pipeline.plan.settings import EngineSettings

_FLAGS = {"choice": "--choice", "regex": "--regex", "json_schema": "--json-schema"}


def check_before_run(settings: EngineSettings, guided: Guided | None, spec: ModelSpec, tokenizer, model) -> None:
    """The settings' hardware spec file (when the job plans), offload folder (made if missing and written to, where
    the engines run on this machine) and the job-wide constraint `guided` (compiled once for the model's tokenizer,
    within its time limit)."""
    if settings.plan and settings.hardware is not None:
        from planner.hardware import load_hardware

        load_hardware(settings.hardware)  # HardwareSpecError naming the file and the fix
    if not settings.use_ray or settings.address is None:  # the engines run on this machine; a cluster's nodes
        checked_offload_root(settings.offload_dir)  # each check their own where their engine starts
    if guided is not None:
        check_job_constraint(guided, spec, tokenizer, model)


def check_job_constraint(guided: Guided, spec: ModelSpec, tokenizer, model) -> None:
    """Compile the job-wide constraint as an engine would (engine/loop/grammar.py); ConfigError naming its option
    where it does not compile, or not within its limit: every row would fail with the same error."""
    from engine.engine import eos_ids_of
    from engine.loop.grammar import Grammars, GuidedError

    grammars = Grammars(tokenizer, spec.vocab_size, eos_ids_of(model, spec))
    try:
        grammars.compiled(guided)
    except GuidedError as e:
        flag = _FLAGS.get(guided.kind, "the job's constraint")
        raise ConfigError(f"{flag} cannot constrain this job's answers: {e}") from None
