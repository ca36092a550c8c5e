"""Input pipelines: `create_data_iterator(config, mesh)` returns (train, eval or None).

Holds the `dataset_type` registry (`register_dataset_type`: the one place a type is added),
`synthetic`, `network_grain` (the epoch plan, the batch builder, ShiftData, the Grain graph)
and the `batches` command. May import `format`, `data`, `distributed`, `config` and `errors`;
never `trainer`, `bench`, `maxtext` or `cli`.

`create_data_iterator` is imported on first use: Grain worker processes import this package
to unpickle their dataset graph, and should not pay for importing JAX.
"""

from maxtext_netdata.input_pipeline.registry import register_dataset_type

__all__ = ["create_data_iterator", "register_dataset_type"]


def __getattr__(name: str):
  if name == "create_data_iterator":
    from maxtext_netdata.input_pipeline.interface import create_data_iterator  # noqa: PLC0415

    return create_data_iterator
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
