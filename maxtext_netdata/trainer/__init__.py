"""The MaxText-style trainer: the flax model, the train loop, the metric logger that writes
step n-1 while step n runs, Orbax checkpoints, evaluation and the main job's report.

May import `format`, `data`, `input_pipeline`, `distributed` and `config`; never `bench`,
`maxtext` or `cli`.
"""
