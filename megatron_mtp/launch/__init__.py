"""Launching training jobs: Slurm batch jobs with auto-resume (`megatron-mtp submit`).

The design note is README.md beside this file. Nothing here imports torch or megatron-core.
"""
