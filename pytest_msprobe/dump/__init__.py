"""Stage 1, the dump: dump.json reading (every version), entry names, safe tensor paths; the byte-range
index and its cache; groups of identical calls (msprobe_filter_api)."""
