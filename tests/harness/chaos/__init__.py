"""Seeded, randomized fault campaigns on the production path (``make chaos``).

* :mod:`.commitpath`: threads that run the production micro-batch path (the stream source's
  planning, the segment sink's write and commit), the sealer, rollback, re-ingest, expiry and
  garbage collection at once against one metadata store, with crashes between steps and
  injected commit failures. Hundreds of schedules a minute; no Spark JVM.
* :mod:`.process`: a real cluster (a Tansu broker, a controller, two workers with their own
  Spark JVMs, PostgreSQL and moto's S3 server or SQLite and local files) ingesting two
  ``replicas: 2`` datastreams (standby, active-active) while processes are killed and frozen,
  the REST API storms them with lifecycle commands, rollbacks and re-ingestions, seals fail at
  their named points and :mod:`.proxy` cuts and stalls the connections to PostgreSQL and S3.

Campaigns print through :class:`.log.CampaignLog`: the seed, each schedule, each fault with
its time, each anomaly, and a final line ``N faults in M schedules, K anomalies``.
"""
