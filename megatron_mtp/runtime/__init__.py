"""What processes share at run time, below every command: one file lock and one liveness check."""
