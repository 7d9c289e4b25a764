"""One router per resource: datastreams, tables, cluster (workers, health, settings), metrics."""
