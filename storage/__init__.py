"""npmdb.storage: what lives on disk (LMDB is the source of truth; index files beside it).

Storage knows nothing of queries: it stores documents, blocks, vectors, segments and
version manifests, and hands out readers.
"""
