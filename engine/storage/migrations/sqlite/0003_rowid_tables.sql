-- Rows of about a kilobyte belong in rowid tables: in WITHOUT ROWID tables they overflow the
-- key's B-tree pages and every write rewrites far more than the row.
CREATE TABLE objects_rowid (
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    revision  INTEGER NOT NULL,
    value     TEXT    NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
INSERT INTO objects_rowid SELECT kind, namespace, name, revision, value FROM objects;
DROP TABLE objects;
ALTER TABLE objects_rowid RENAME TO objects;

CREATE TABLE events_rowid (
    revision  INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    type      INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    value     TEXT    NOT NULL,
    PRIMARY KEY (revision, seq)
);
INSERT INTO events_rowid SELECT revision, seq, type, kind, namespace, name, value FROM events;
DROP TABLE events;
ALTER TABLE events_rowid RENAME TO events;
CREATE INDEX events_by_key ON events (kind, namespace, name, revision, seq);
