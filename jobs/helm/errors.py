"""Errors of the HELM-style benchmark job."""

from engine.errors import FlexbatchError


class SpecError(FlexbatchError, ValueError):
    """A bad benchmark spec, scenario file or scenario_state.json: the message names the bad field or value,
    what was expected, and the fix."""
