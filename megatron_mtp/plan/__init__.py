"""`megatron-mtp plan`: per-rank memory, pipeline schedule and communication of a run, computed
from the same config objects training uses, without starting a process (memory.py has the design note)."""
