"""Stage 7, the reports: records -> msprobe's CSV files, JSON lines, failure tables, record summaries;
the `compare` command."""
