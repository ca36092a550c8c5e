"""Raw measurements to the prepared store: the raw schema and its checks, address parsing,
`generate`, `prepare`, the memory-mapped store, remote storage (`gs://`, `s3://`) and the
`tokenize` command.

May import `format`, `config` and `errors`; never `input_pipeline`, `trainer`, `bench`,
`maxtext` or `cli`.
"""
