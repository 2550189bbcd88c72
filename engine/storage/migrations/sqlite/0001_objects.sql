-- Current state: one row per object, the value is its Kubernetes JSON.
CREATE TABLE objects (
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    revision  INTEGER NOT NULL,
    value     TEXT    NOT NULL,
    PRIMARY KEY (kind, namespace, name)
) WITHOUT ROWID;

-- History since the last compaction: what watch(from_revision) replays.
CREATE TABLE events (
    revision  INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    type      INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    value     TEXT    NOT NULL,
    PRIMARY KEY (revision, seq)
) WITHOUT ROWID;

-- `revision`: the global revision; `compacted`: events at or below it are gone.
CREATE TABLE meta (
    key   TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO meta (key, value) VALUES ('revision', 0), ('compacted', 0);
