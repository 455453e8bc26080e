"""`flexbatch bench ...`: every benchmark and its helpers (models, timing, the report table)."""
