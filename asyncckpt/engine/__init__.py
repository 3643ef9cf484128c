"""The engine: a runtime (pool, executors, CPU lane) and the save and load orchestrations over
the pipeline, the ordered reader, verification, sealing and manifests."""
