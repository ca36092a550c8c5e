"""The raw-data contract (docs/spec.md §1): what a folder of raw ping parquet is, and how it
is read and checked.

`schema` (the columns, their checks, numpy columns out), `reader` (the one raw-parquet
reader: footers first, then validated row batches), `addresses` and `ip_text` (address text
→ 16 bytes, compiled), `layout` (file names, marker and row groups the writers use),
`probe_hash` (the probe hash that `prepare` splits by and `ingest` samples by).

May import `data.remote`, `kernels` and `errors`; no other stage.
"""
