"""Seeded, randomized fault campaigns on the production path (``millstream chaos``).

* :mod:`.commitpath`: threads that run the production micro-batch path (the stream source's
  planning, the segment sink's write and commit), the sealer, rollback, re-ingest, expiry and
  garbage collection at once against one metadata store, with crashes between steps and
  injected commit failures. Hundreds of schedules a minute; no Spark JVM.

Campaigns print through :class:`.log.CampaignLog`: the seed, each schedule, each fault with
its time, each anomaly, and a final line ``N faults in M schedules, K anomalies``.
"""
