"""Benchmarks of pytest-msprobe: speed, scaling and memory, and the dumps they run on. `python -m benchmarks`
lists them; `python -m benchmarks NAME [args]` runs one."""
