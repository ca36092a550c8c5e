"""Real MaxText with `dataset_type=network_grain`: the plugin that extends MaxText's config
and `create_data_iterator`, and the `maxtext-train` entry point.

May import `config`, `data`, `input_pipeline` and `distributed`; never `trainer`, `bench`
or `cli`. MaxText itself is imported only when the plugin is installed.
"""
