"""Raw measurements to the prepared store, one sub-room per stage of the flow:

    ripe/ (RIPE Atlas JSON) ─┐
                             ├─> raw/ (the raw parquet contract) ──> prepare/ ──> store/
    synthetic/ (generated) ──┘

- `raw/`: the contract every source meets (docs/spec.md §1): the schema and its checks, the
  one raw-parquet reader, address parsing, the file layout `generate` and `ingest` write.
- `ripe/`: `ingest`, RIPE Atlas results (JSON lines or arrays, plain or compressed) → raw
  parquet; its compiled JSON scanner in `ripe/scanner/`.
- `synthetic/`: `generate`, realistic raw parquet (or RIPE JSON) from a seed.
- `prepare/`: `prepare`, raw parquet → the store (partition by probe hash, sort, assemble) on
  the built-in runner or Apache Beam, cached by fingerprint; the `tokenize` command.
- `store/`: the prepared store's format and reader, and its copy to and from `gs://`/`s3://`.
- `remote` (a module beside them): listing and opening files on local disk, `gs://`, `s3://`.

Imports flow along the drawing: `raw/` imports `remote` only; `ripe/` and `synthetic/` import
`raw/`; `prepare/` imports `raw/` and `store/`; `store/` imports `remote` only. Every stage may
import `kernels`, `config` and `errors`, and `prepare/` the token `format`; nothing here imports
JAX, `input_pipeline`, `trainer`, `bench`, `maxtext` or `cli`.
"""
