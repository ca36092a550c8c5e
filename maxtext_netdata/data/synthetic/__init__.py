"""`generate`: realistic raw ping parquet (or RIPE Atlas JSON lines) from a seed, for tests,
benchmarks and the built-in sample run.

May import `data.raw` (the file layout), `config` and `errors`.
"""
