"""Devices and processes: the mesh and batch sharding, `jax.distributed` start-up and which
rows of a global batch each process loads.

May import `config` and `errors` only, so that the input pipeline and the trainer can both
use it.
"""
