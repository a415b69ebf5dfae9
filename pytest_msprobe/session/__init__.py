"""The pytest layer: collection and items, device pool and pinning, crash and timeout guard, journal
and resume, shards, cost scheduling, worker count, baseline, fuzz items, triage hooks, --msprobe-
config, terminal lines. Everything below it is pytest-free."""
