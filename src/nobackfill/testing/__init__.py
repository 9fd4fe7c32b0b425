"""Throwaway servers for tests and benchmarks: a PostgreSQL server (``postgres_server``) and a
Milvus standalone server (``milvus_server``), each started in a temporary directory on 127.0.0.1
and stopped with it. Never used by the product itself.

Layer: core. May import: nothing of nobackfill.
"""
