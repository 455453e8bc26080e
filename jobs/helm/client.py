"""HELM's client for the flexbatch deployment: it answers each request from a `flexbatch helm-batch` store and
never runs a model, so `helm-run` computes HELM's own metrics on results the pipeline computed in bulk. A request
the store lacks is an error naming it (and the command that computes it), never a silent recompute. Imported by
HELM (crfm-helm installed) through the deployment's `client_spec`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import dacite
from helm.clients.client import Client
from helm.common.request import ErrorFlags, Request, RequestResult

from jobs.helm.store import read_results, request_key


class FlexbatchClient(Client):
    def __init__(self, store: str):
        self.store = Path(store)
        self._results: dict[str, dict] | None = None

    def make_request(self, request: Request) -> RequestResult:
        if self._results is None:
            self._results = read_results(self.store)
        key = request_key(dataclasses.asdict(request))
        if key not in self._results:  # a fatal, not retriable failure: HELM stops the run with this message
            error = (f"the flexbatch store {self.store} has no result for the request {key[:12]} (prompt "
                     f"{request.prompt[:80]!r}, max_tokens={request.max_tokens}, temperature={request.temperature}); "
                     "run helm-run with --dry-run, then flexbatch helm-batch on that suite, before this run")
            return RequestResult(success=False, embedding=[], completions=[], cached=False, error=error,
                                 error_flags=ErrorFlags(is_retriable=False, is_fatal=True))
        return dacite.from_dict(RequestResult, self._results[key])
