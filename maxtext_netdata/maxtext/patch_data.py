"""The data patch: MaxText's `create_data_iterator` builds our pipeline for `network_grain`.

`input_pipeline_interface.create_data_iterator` translates MaxText's config into ours
(`patch_config.network_config`), takes the splits our own `create_data_iterator` loads
(`input_pipeline.network_splits`) and hands each to MaxText's `create_process_specific_iterator`:
every loading process gets its rows of each global batch in a `MultiHostDataLoadIterator`, as
MaxText's own Grain pipeline does. Every other dataset type goes to MaxText unchanged.
"""

from __future__ import annotations

import time

from maxtext_netdata.maxtext.patch_config import NETWORK_GRAIN, MaxTextPluginError, network_config
from maxtext_netdata.maxtext.patch_metrics import TRAIN_FEED, Feed
from maxtext_netdata.maxtext.patch_processes import HostBatches

# What install() patches: (module, attribute).
REQUIRED = (
  ("maxtext.input_pipeline.input_pipeline_interface", "create_data_iterator"),
  ("maxtext.input_pipeline.input_pipeline_interface", "get_process_loading_real_data"),
  ("maxtext.input_pipeline.input_pipeline_interface", "create_process_specific_iterator"),
  ("maxtext.input_pipeline.multihost_dataloading", "MultiHostDataLoadIterator"),
)


def _make_iterator_class(multihost_dataloading):
  class NetworkDataLoadIterator(multihost_dataloading.MultiHostDataLoadIterator):
    """MaxText's multi-host iterator over our host batches, timing each and measuring padding.

    `local_iterator` is our `PositionIterator`, whose data position MaxText's checkpointing
    saves and restores (`get_state`/`set_state`).
    """

    def __init__(self, dataloader, global_mesh, feed: Feed | None):
      super().__init__(dataloader, global_mesh)
      self._feed = feed

    def __next__(self):
      start = time.perf_counter()
      batch = super().__next__()
      if self._feed is not None:
        self._feed.record(time.perf_counter() - start, self.last_local_data["targets_segmentation"])
      return batch

  return NetworkDataLoadIterator


def _make_create_data_iterator(interface, original, iterator_class):
  """`create_data_iterator(config, mesh)` that serves network_grain and defers the rest."""

  def create_data_iterator(config, mesh):
    if config.dataset_type != NETWORK_GRAIN:
      return original(config, mesh)
    if config.expansion_factor_real_data not in (-1, 1) or config.colocated_python_data_input:
      raise MaxTextPluginError(
        "dataset_type=network_grain loads real data on every host: set"
        " expansion_factor_real_data=-1 and colocated_python_data_input=false"
      )
    import jax  # noqa: PLC0415

    from maxtext_netdata.distributed import multihost  # noqa: PLC0415
    from maxtext_netdata.input_pipeline import network_splits  # noqa: PLC0415

    # MaxText evaluates only with eval_interval > 0, and then needs an eval iterator.
    train, evaluation = network_splits.network_splits(
      network_config(config),
      train_rows=config.global_batch_size_to_load,
      eval_rows=config.global_batch_size_to_load_eval if config.eval_interval > 0 else None,
      eval_steps=config.eval_steps,
      eval_required=True,
    )

    def multihost_iterator(split: network_splits.SplitBatches):
      """`split` in MaxText's iterator on each process that loads real data."""
      rows = split.builder.global_batch_size
      is_training = split.split == "train"
      processes = interface.get_process_loading_real_data(
        config.data_sharding, rows, rows, config.max_target_length, mesh
      )

      def make(_, host_mesh, process_indices):
        lo, hi = multihost.process_row_range(
          rows, process_indices.index(jax.process_index()), len(process_indices)
        )
        feed = TRAIN_FEED if is_training else None
        return iterator_class(HostBatches(split, lo, hi), host_mesh, feed)

      return interface.create_process_specific_iterator(
        config, mesh, processes, make, is_training=is_training
      )

    return multihost_iterator(train), None if evaluation is None else multihost_iterator(evaluation)

  return create_data_iterator


def install(interface, multihost_dataloading):
  """Serves network_grain from `interface.create_data_iterator`; returns the iterator class
  it hands MaxText (`NetworkDataLoadIterator`, a `MultiHostDataLoadIterator`)."""
  iterator_class = _make_iterator_class(multihost_dataloading)
  interface.create_data_iterator = _make_create_data_iterator(
    interface, interface.create_data_iterator, iterator_class
  )
  return iterator_class
