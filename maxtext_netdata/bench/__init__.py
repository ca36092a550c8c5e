"""`maxtext-netdata bench`: MaxText's pipeline-performance guide as one command (target
step, loading alone, real-data run, verdict, report and plot), for our configs (`benchmark`)
and for any MaxText config on MaxText's own trainer and loader (`maxtext_bench`, sub-runs in
`maxtext_run`); what both measure alike, loading alone and the worker sweep (`loading`); the
figures and verdict (`report`) and their table, JSON and plot (`render`); the profile check
from a JAX trace (`profile`); accelerator peak figures (`accelerators`) and the model's FLOPs
per token (`flops`); the one-command check for a GPU or TPU VM with no network
(`accelerator_check`, run by `scripts/accelerator_check.sh`; its table and trimmed trace in
`accelerator_report`); a generated text corpus for
MaxText's text pipeline (`text_corpus`).

May import every room below it (`format`, `data`, `input_pipeline`, `distributed`,
`trainer`, `maxtext`); never `cli`.
"""
