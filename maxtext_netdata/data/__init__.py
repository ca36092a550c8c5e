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
- `beam_temp` (beside them too): the temporary-file folder of both Beam runners.

Imports flow along the drawing: `raw/` imports `remote` only; `ripe/` and `synthetic/` import
`raw/`; `prepare/` imports `raw/` and `store/`; `store/` imports `remote` only. Every stage may
import `kernels`, `config` and `errors`, and `prepare/` the token `format`; nothing here imports
JAX, `input_pipeline`, `trainer`, `bench`, `maxtext` or `cli`.
"""

import importlib
import warnings

# Deprecated: the flat modules of `data/` before it was split by stage, by their new place
# below this package (docs/architecture.md, "Moved modules"). `from maxtext_netdata.data import
# schema` still works, with a DeprecationWarning; `data.prepare` and `data.store` are packages
# now, so their old modules are `data.prepare.prepare` and `data.store.store`.
_MOVED = {
  "addresses": "raw.addresses",
  "assemble": "prepare.assemble",
  "generate": "synthetic.generate",
  "ingest": "ripe.ingest",
  "ingest_read": "ripe.blocks",
  "ip_text": "raw.ip_text",
  "json_array": "ripe.json_array",
  "json_scan": "ripe.scanner.json_scan",
  "local_runner": "prepare.local_runner",
  "prepare_beam": "prepare.beam_runner",
  "probes": "prepare.probes",
  "raw_reader": "raw.reader",
  "ripe_json": "ripe.reference",
  "ripe_scan": "ripe.scan",
  "ripe_scan_kernel": "ripe.scanner.kernel",
  "row_kernels": "prepare.row_kernels",
  "schema": "raw.schema",
  "shards": "prepare.partition",
  "store_copy": "store.remote_copy",
  "tokenize_cli": "prepare.tokenize_cli",
}


def __getattr__(name: str):
  if name in _MOVED:
    new = f"{__name__}.{_MOVED[name]}"
    warnings.warn(f"{__name__}.{name} moved to {new}", DeprecationWarning, stacklevel=2)
    return importlib.import_module(new)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
