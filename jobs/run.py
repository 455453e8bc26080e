"""`python -m jobs.run ...`: the Parquet-in, Parquet-out job, with the same options as `flexbatch run`."""

from jobs.run_cmd import run

if __name__ == "__main__":
    run(prog_name="python -m jobs.run")
