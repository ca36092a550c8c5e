"""`ingest`: RIPE Atlas ping results (JSON lines or arrays; plain, gzip, bz2 or zstd; local,
`gs://`, `s3://`) → raw parquet (docs/spec.md §1, docs/data_format.md).

`ingest` (the command and its writer), `blocks` (inputs as blocks of lines), `json_array`
(a JSON array split into lines), `scan` (the fast path: the compiled scanner of `scanner/`),
`reference` (DuckDB's reader and Arrow: the reference path and the error reporter) and
`sample` (the whole probes and time window `--probe-fraction`, `--since`, `--until` keep).

May import `data.raw`, `data.remote`, `kernels`, `config` and `errors`.
"""
