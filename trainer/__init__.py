"""The filter studio's trainer service (docs/studio.md): takes training jobs from the cloud over REST, trains them
as `filterforward train` does and posts the bundles with their reports. It imports nothing of the cloud service and
needs torch; `filterforward trainer serve` (filterforward/commands/trainer.py) runs it."""
