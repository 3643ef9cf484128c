"""Local S3 servers for tests, benchmarks and ``--embedded-s3``: moto, a one-node Swift, and
what such servers do differently from AWS (:mod:`.s3compat`).

Kept out of the library core: the pipeline, sinks, stores, results and the checkpointer never
import this package (tests/test_layering.py checks it), so a training job that saves
checkpoints loads none of it. It may import the core (SigV4 signing, errors, environment).
"""
