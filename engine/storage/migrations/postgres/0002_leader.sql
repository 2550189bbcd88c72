-- The leader lease: one row. `token` goes up by one at every change of holder and is the fence
-- every write of a fenced store checks in its own transaction. Times are the database's clock
-- (now()), the one clock every replica shares.
CREATE TABLE leader (
    id         SMALLINT    PRIMARY KEY CHECK (id = 1),
    holder     TEXT        NOT NULL,
    token      BIGINT      NOT NULL CHECK (token >= 0),
    renewed_at TIMESTAMPTZ,
    expires_at TIMESTAMPTZ NOT NULL
);

INSERT INTO leader (id, holder, token, renewed_at, expires_at) VALUES (1, '', 0, NULL, '-infinity');
