"""Job entry points and the `flexbatch` command line."""
