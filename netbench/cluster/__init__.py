"""Cluster managers a campaign's shards are submitted to: the batch script as data
(script.py, pure) and the one module that calls Slurm's commands (slurm.py, behind a small
interface with a fake in tests/fakes/slurm.py)."""
