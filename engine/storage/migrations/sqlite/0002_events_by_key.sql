-- Reads at a past revision (list continuation) and compaction look up an object's history.
CREATE INDEX events_by_key ON events (kind, namespace, name, revision, seq);
