"""`prepare`: raw parquet → the prepared store, in bounded memory, cached by fingerprint.

`prepare` (the command, the lock and the cache; `ensure_prepared`), `naming` (a store's
fingerprint and content key), `partition` (rows → probe buckets, a bucket → sorted rows),
`probes` (a batch's probes and their hashes), `row_kernels` (the compiled per-row passes),
`assemble` (sorted buckets → the splits), `append` and `merge` (new files added to a store,
files no longer listed taken out), `upgrade` (a store of the format before converted), the
two runners (`local_runner`: spill files in this process; `beam_runner`: Apache Beam) and
the `tokenize` command (`tokenize_cli`).

May import `data.raw`, `data.store`, `data.remote`, `format`, `kernels`, `config` and
`errors`.
"""


def __getattr__(name: str):
  # The documented entry point `from maxtext_netdata.data.prepare import ensure_prepared`,
  # resolved on use so that importing one module of this stage does not import them all.
  if name == "ensure_prepared":
    from maxtext_netdata.data.prepare.prepare import ensure_prepared  # noqa: PLC0415

    return ensure_prepared
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
