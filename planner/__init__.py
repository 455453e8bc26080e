"""The planner: a hardware profile, FlexGen's cost model with FlexInfer's per-phase compute choice, and a cvxpy
search that picks the engine's `Policy` for a model, a workload and a machine, and explains it."""
