"""Stage 4, the metrics: msprobe's accuracy metrics, without torch at import.

stats.py defines the statistics of one output and the columns made of them; backends.py lists the passes that
compute the statistics (numpy, numba, torch on the device, streamed); vectorised.py computes the columns in numpy.
"""
