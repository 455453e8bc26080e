"""The HELM-style job: specs, scenarios, adapters, metrics, HELM's output files, and `flexbatch helm`."""
