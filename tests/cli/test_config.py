"""config: one typed model, YAML + overrides, helpful errors, base_config chains."""

import pickle
import subprocess
import sys

import pytest
import yaml

from maxtext_netdata import config
from maxtext_netdata.config import model as config_model
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.format import tokens as tk


def _write(path, values):
  path.write_text(yaml.safe_dump(values))
  return str(path)


def test_base_yml_is_written_from_the_model():
  """base.yml documents every key of ConfigModel: same order, default and description."""
  text = (config.configs_dir() / "base.yml").read_text(encoding="utf-8")
  assert text == config.base_yml(), "run: python -m maxtext_netdata.config > configs/base.yml"
  fields = config.ConfigModel.model_fields
  documented = [line for line in text.splitlines() if line and not line.startswith("#")]
  assert [line.split(":")[0] for line in documented] == list(fields)
  for line in documented:
    key = line.split(":")[0]
    assert line.split("  # ", 1)[1] == fields[key].description and fields[key].description
    value = yaml.safe_load(line)[key]
    assert value == fields[key].default and type(value) is type(fields[key].default), key


def test_defaults_are_base_yml():
  cfg = config.load(None)
  with open(config.configs_dir() / "base.yml") as f:
    base = yaml.safe_load(f)
  assert cfg.get_keys() == base
  assert cfg.steps == base["steps"] and cfg.config_path == "base.yml"


@pytest.mark.parametrize(
  "override, key, expected",
  [
    ("steps=10", "steps", 10),
    ("learning_rate=1e-3", "learning_rate", 0.001),
    ("learning_rate=2", "learning_rate", 2.0),
    ("learning_rate=.5", "learning_rate", 0.5),
    ("packing=false", "packing", False),
    ("enable_tensorboard=True", "enable_tensorboard", True),
    ("data_sharding=[data, fsdp]", "data_sharding", ["data", "fsdp"]),
    ("network_mode_weights=[1, 0, 0]", "network_mode_weights", [1, 0, 0]),
    ("run_name=exp 1", "run_name", "exp 1"),
    ("run_name=123", "run_name", "123"),
    ("run_name=2025-07-01", "run_name", "2025-07-01"),
    ("run_name=null", "run_name", "null"),
    ("grain_train_files=a.parquet,b.parquet", "grain_train_files", "a.parquet,b.parquet"),
    ("network_prepared_dir=", "network_prepared_dir", ""),
    ("network_since=2025-07-02", "network_since", "2025-07-02"),
    ("network_until=2025-07-09T06:00:00+02:00", "network_until", "2025-07-09T06:00:00+02:00"),
  ],
)
def test_override_values(override, key, expected):
  value = config.load(None, [override])[key]
  assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
  "override, message",
  [
    ("stpes=3", "command line: unknown config key 'stpes'; did you mean 'steps'?"),
    ("steps=ten", "command line: steps='ten' has type str, expected int"),
    ("steps=1.5", "steps=1.5 has type float, expected int"),
    ("packing=1", "packing=1 has type int, expected bool"),
    ("learning_rate=fast", "learning_rate='fast' has type str, expected float"),
    ("data_sharding=data", "data_sharding='data' has type str, expected list"),
    ("steps", "is not of the form key=value"),
    ("dataset_type=tfds", "dataset_type='tfds' is not one of"),
    ("steps=0", "steps=0 must be positive"),
    ("network_test_fraction=1.0", "network_test_fraction=1.0 must be in [0, 1)"),
    ("network_mode_weights=[1, 2]", "network_mode_weights"),
    ("num_epoch=0", "num_epoch=0 must be -1"),
    ("grain_worker_count=-2", "grain_worker_count=-2"),
    # Values Grain or the model would fail on later with a traceback, or train on as NaN.
    ("vocab_size=100", "vocab_size=100 must be at least 268, the netdata-v1 vocabulary"),
    ("grain_num_threads=-1", "grain_num_threads=-1 must be 0 or more"),
    ("grain_prefetch_buffer_size=-1", "grain_prefetch_buffer_size=-1 must be 0 or more"),
    ("grain_per_worker_buffer_size=0", "grain_per_worker_buffer_size=0 must be positive"),
    ("global_batch_size_to_load=0", "global_batch_size_to_load=0 must be -1 (derived) or >= 1"),
    ("global_batch_size_to_load=-5", "global_batch_size_to_load=-5 must be -1"),
    ("learning_rate_schedule_steps=0", "learning_rate_schedule_steps=0 must be -1"),
    ("base_emb_dim=0", "base_emb_dim=0 must be positive"),
    ("base_num_decoder_layers=-1", "base_num_decoder_layers=-1 must be positive"),
    ("network_since=July 2", "network_since='July 2' is not an ISO 8601 time"),
  ],
)
def test_override_errors(override, message):
  with pytest.raises(ConfigError) as error:
    config.load(None, [override])
  assert message in str(error.value)
  assert "\n" not in str(error.value)  # one line


def test_smallest_vocabulary_is_the_token_formats():
  assert config_model.NETDATA_VOCAB_SIZE == tk.VOCAB_SIZE
  assert config.load(None, [f"vocab_size={tk.VOCAB_SIZE}"]).vocab_size == tk.VOCAB_SIZE


def test_unknown_key_in_file_names_file_and_suggests(tmp_path):
  path = _write(tmp_path / "run.yml", {"max_target_lenght": 512})
  with pytest.raises(
    ConfigError,
    match=r"run.yml: unknown config key 'max_target_lenght'; "
    r"did you mean 'max_target_length'\?",
  ):
    config.load(path)
  path = _write(tmp_path / "far.yml", {"zzzz_qqqq": 1})
  with pytest.raises(ConfigError) as error:
    config.load(path)
  assert "did you mean" not in str(error.value)


def test_wrong_type_in_file(tmp_path):
  path = _write(tmp_path / "run.yml", {"per_device_batch_size": "eight"})
  with pytest.raises(ConfigError, match="run.yml: per_device_batch_size='eight' has type str"):
    config.load(path)


def test_times_in_a_file_are_read_as_yaml_writes_them(tmp_path):
  # Unquoted, YAML reads a date and a time as date and datetime objects: taken as their text.
  path = tmp_path / "window.yml"
  path.write_text("network_since: 2025-07-02\nnetwork_until: 2025-07-09 00:00:00\n")
  cfg = config.load(path)
  assert config.iso_seconds(cfg.network_since) == 1751414400  # 2025-07-02T00:00:00Z
  assert config.iso_seconds(cfg.network_until) == 1751414400 + 7 * 86400


def test_base_config_chain_and_override_order(tmp_path):
  _write(tmp_path / "parent.yml", {"base_config": "base.yml", "steps": 7, "run_name": "parent"})
  _write(
    tmp_path / "child.yml", {"base_config": "parent.yml", "run_name": "child", "learning_rate": 1}
  )
  cfg = config.initialize(["prog", str(tmp_path / "child.yml"), "learning_rate=0.25"])
  assert cfg.steps == 7 and cfg.run_name == "child" and cfg.learning_rate == 0.25
  assert cfg.log_period == config.defaults()["log_period"]


def test_base_config_cycle_and_missing_parent(tmp_path):
  _write(tmp_path / "a.yml", {"base_config": "b.yml"})
  _write(tmp_path / "b.yml", {"base_config": "a.yml"})
  with pytest.raises(ConfigError, match="cycle"):
    config.load(str(tmp_path / "a.yml"))
  _write(tmp_path / "orphan.yml", {"base_config": "nowhere.yml"})
  with pytest.raises(ConfigError, match="nowhere.yml"):
    config.load(str(tmp_path / "orphan.yml"))


def test_bad_files(tmp_path):
  with pytest.raises(ConfigError, match="config file not found"):
    config.load(str(tmp_path / "absent.yml"))
  (tmp_path / "broken.yml").write_text("steps: [1, 2\n")
  with pytest.raises(ConfigError, match="broken.yml: not valid YAML"):
    config.load(str(tmp_path / "broken.yml"))
  (tmp_path / "list.yml").write_text("- 1\n- 2\n")
  with pytest.raises(ConfigError, match="list.yml: expected a mapping"):
    config.load(str(tmp_path / "list.yml"))
  (tmp_path / "empty.yml").write_text("")
  assert config.load(str(tmp_path / "empty.yml")).steps == config.defaults()["steps"]


def test_repository_configs_load():
  for path in config.configs_dir().glob("*.yml"):
    config.load(str(path))


def test_initialize_needs_a_config():
  with pytest.raises(ConfigError, match="usage"):
    config.initialize(["prog"])


def test_config_is_read_only_and_replace_validates():
  cfg = config.load(None)
  with pytest.raises(AttributeError, match="read-only"):
    cfg.steps = 3
  with pytest.raises(AttributeError, match="did you mean 'steps'"):
    _ = cfg.stepz
  changed = cfg.replace(steps=3, learning_rate=1)
  assert changed.steps == 3 and changed.learning_rate == 1.0 and cfg.steps != 3
  with pytest.raises(ConfigError, match="did you mean 'steps'"):
    cfg.replace(stepz=3)
  with pytest.raises(ConfigError, match="must be positive"):
    cfg.replace(steps=-1)
  again = pickle.loads(pickle.dumps(changed))
  assert again.get_keys() == changed.get_keys() and "steps" in again


def test_derived_values(tmp_path):
  cfg = config.load(None, [f"base_output_directory={tmp_path}", "run_name=r1"])
  assert cfg.run_dir == tmp_path / "r1"
  assert cfg.prepared_dir == str(tmp_path / "prepared")
  assert cfg.replace(network_prepared_dir="/data/p").prepared_dir == "/data/p"
  assert cfg.replace(per_device_batch_size=2).global_batch_size(4) == 8
  assert cfg.replace(global_batch_size_to_load=6).global_batch_size(4) == 6
  assert cfg.replace(per_device_batch_size=0.5).global_batch_size(4) == 2
  with pytest.raises(ConfigError, match="not a whole number"):
    cfg.replace(per_device_batch_size=0.5).global_batch_size(3)


def test_importing_config_and_unpickling_one_costs_no_pydantic():
  """Grain workers import config to unpickle a Config; only validating builds the model."""
  payload = pickle.dumps(config.load(None, ["steps=3"]))
  script = (
    "import pickle, sys\n"
    f"cfg = pickle.loads({payload!r})\n"
    "assert cfg.steps == 3 and 'pydantic' not in sys.modules, sorted(sys.modules)\n"
    "cfg.replace(steps=4)\n"
    "assert 'pydantic' in sys.modules\n"
  )
  subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
