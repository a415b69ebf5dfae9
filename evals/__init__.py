"""Evaluation of the checker apart from its benchmarks: planted kernel bugs and correct variants armed inside
the device-call boundary (`evals.planted`), the fused-op suite, and the per-process probes of a run
(`evals.probes`). The tests use them; `python -m evals` lists the scripts."""
