"""`maxtext-netdata bench`: MaxText's pipeline-performance guide as one command (target
step, loading alone, real-data run, verdict, report and plot), and accelerator peak figures.

May import every room below it (`format`, `data`, `input_pipeline`, `distributed`,
`trainer`); never `cli`.
"""
