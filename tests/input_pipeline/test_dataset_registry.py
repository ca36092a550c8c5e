"""Adding a dataset type is one call, `register_dataset_type(name, factory)`: our config accepts
it, our trainer trains on it and MaxText's config validation (through the plugin) admits it."""

import math
import os

import pytest

from maxtext_netdata import config
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.input_pipeline import register_dataset_type, registry
from maxtext_netdata.trainer import train
from tests.helpers.train import IndexedBatches

MAXTEXT_SMOKE = os.path.join(
  os.path.dirname(__file__), "..", "..", "configs", "maxtext", "smoke.yml"
)
TINY_MODEL = [
  "base_num_decoder_layers=1",
  "base_emb_dim=32",
  "base_num_query_heads=2",
  "base_num_kv_heads=2",
  "head_dim=16",
  "base_mlp_dim=64",
  "dtype=float32",
  "max_target_length=64",
  "per_device_batch_size=4",
  "log_period=1",
]


class ToyDataset:
  """A toy dataset type: the trainer helpers' arithmetic sequences; remembers its iterators."""

  def __init__(self):
    self.made = []

  def __call__(self, cfg, mesh):
    iterators = (IndexedBatches(cfg, mesh), IndexedBatches(cfg, mesh, seed=1))
    self.made.append(iterators)
    return iterators


@pytest.fixture
def toy():
  dataset = ToyDataset()
  register_dataset_type("toy", dataset)  # the one edit a new dataset type needs
  yield dataset
  registry.unregister_dataset_type("toy")


def test_unregistered_type_is_refused_with_the_registered_names():
  with pytest.raises(
    ConfigError, match=r"command line: dataset_type='toy' is not one of network_grain, synthetic$"
  ):
    config.load(None, ["dataset_type=toy"])
  with pytest.raises(ValueError, match="identifier"):
    register_dataset_type("not a name", ToyDataset())


def test_registered_type_trains_through_our_trainer(tmp_path, toy):
  cfg = config.load(
    "configs/smoke.yml",
    [
      f"base_output_directory={tmp_path}",
      "dataset_type=toy",
      *TINY_MODEL,
      "steps=3",
      "eval_interval=3",
      "eval_steps=2",
      "enable_checkpointing=false",
      "enable_tensorboard=false",
    ],
  )
  assert registry.dataset_types() == ("network_grain", "synthetic", "toy")
  summary = train.train(cfg)
  assert summary["dataset_type"] == "toy" and summary["steps"] == 3
  assert math.isfinite(summary["final_loss"]) and math.isfinite(summary["eval_loss"])
  # The trainer drew its batches from the toy type's iterators.
  (train_iterator, eval_iterator), *_ = toy.made
  assert len(toy.made) == 1 and train_iterator.get_state() == {"index": 3}


@pytest.mark.slow  # imports MaxText
def test_registered_type_passes_maxtext_config_validation(toy):
  pytest.importorskip("maxtext", reason="MaxText is not installed (pip install '.[maxtext]')")
  from maxtext.configs import pyconfig  # noqa: PLC0415

  from maxtext_netdata.maxtext import plugin  # noqa: PLC0415

  plugin.install()
  argv = ["test", MAXTEXT_SMOKE, "base_output_directory=/tmp/unused", "dataset_type=toy"]
  assert pyconfig.initialize(argv).dataset_type == "toy"
  registry.unregister_dataset_type("toy")
  with pytest.raises(
    plugin.MaxTextPluginError,
    match="^MaxText config: dataset_type='toy' is not one of c4_mlperf, grain",
  ):
    pyconfig.initialize(argv)
