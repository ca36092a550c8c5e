"""Real MaxText with `dataset_type=network_grain`: the plugin and the `maxtext-train` entry point.

- `plugin`: `install()` applies every patch below to an imported MaxText, after checking its
  version and every attribute they replace; `network_config`, `MaxTextPluginError`.
- `patch_config`: `NetworkMaxTextConfig` (MaxText's config with our dataset types and
  `network_*` keys) as `pyconfig`'s default; `network_config` (MaxText's config as ours).
- `patch_data`: `create_data_iterator` for `network_grain`, our splits in MaxText's multi-host
  iterator.
- `patch_checkpoints`: the data position in MaxText's checkpoints, restored across process
  counts.
- `patch_processes`: `HostBatches`, which starts workers at the first train batch and closes
  the iterator each `reset()` replaces.
- `patch_metrics`: `perf/data_wait_seconds` and `learning/padding_fraction` in each training
  step's metrics.
- `train`: `maxtext-netdata maxtext-train`, MaxText's own trainer with the plugin on.

May import `config`, `data`, `input_pipeline` and `distributed`; never `trainer`, `bench`
or `cli`. MaxText itself is imported only when the plugin is installed.
"""
