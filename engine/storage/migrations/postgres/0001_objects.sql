-- The same tables as the SQLite backend, so both stores answer identically.
--
-- Keys are compared byte by byte (COLLATE "C"), as SQLite does: list order, continue tokens and
-- the (namespace, name) > (...) paging predicates must not depend on the database's locale.
-- Values are the JSON text exactly as the store wrote it (TEXT, not JSONB): JSONB would reorder
-- keys, refuse "\u0000" escapes that serde_json produces, and the size limit is measured on
-- this text anyway.

-- Current state: one row per object, the value is its Kubernetes JSON.
CREATE TABLE objects (
    kind      TEXT COLLATE "C" NOT NULL,
    namespace TEXT COLLATE "C" NOT NULL,
    name      TEXT COLLATE "C" NOT NULL,
    revision  BIGINT NOT NULL,
    value     TEXT   NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);

-- History since the last compaction: what watch(from_revision) replays.
CREATE TABLE events (
    revision  BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    type      BIGINT NOT NULL,
    kind      TEXT COLLATE "C" NOT NULL,
    namespace TEXT COLLATE "C" NOT NULL,
    name      TEXT COLLATE "C" NOT NULL,
    value     TEXT   NOT NULL,
    PRIMARY KEY (revision, seq)
);

-- Reads at a past revision (list continuation) and compaction look up an object's history.
CREATE INDEX events_by_key ON events (kind, namespace, name, revision, seq);

-- `revision`: the global revision; its row is also the writers' lock (every write transaction
-- takes it FOR UPDATE first, so commit order is revision order across processes).
-- `compacted`: events at or below it are gone.
CREATE TABLE meta (
    key   TEXT   PRIMARY KEY,
    value BIGINT NOT NULL
);

INSERT INTO meta (key, value) VALUES ('revision', 0), ('compacted', 0);
