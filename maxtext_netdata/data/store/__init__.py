"""The prepared store: one split of measurements grouped by probe as memory-mappable `.npy`
files (`store`: the format, the reader, probe statistics; `dst_table`: the destinations as a
table and a row index; `memory`: how much memory page cache may take; `shared_arrays`: arrays
computed once and mapped by every process, the epoch plans), and its copy to and from
`gs://` and `s3://` (`remote_copy`).

May import `data.remote`, `kernels` (the destination table's compiled hash table) and
`errors`: the store knows nothing of how it was built.
"""
