"""Versioned schema migrations, one list for both databases.

Each :class:`Migration` takes the schema from ``version - 1`` to ``version``
and carries its SQL twice: once for SQLite, once for PostgreSQL. A store
applies, in order and each in its own transaction, every migration above the
version it finds, and **refuses to open** a database whose version is newer
than :data:`LATEST` — an older llmgw must not write rows a newer one laid out
differently (roll routers forward before reconcilers, never back).

Where the version lives: SQLite's ``PRAGMA user_version``; PostgreSQL's
one-row table ``llmgw_schema``. Append to :data:`MIGRATIONS`; never edit a
released step.

This is a purely declarative module: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    title: str
    sqlite: str
    postgres: str


class SchemaTooNew(RuntimeError):
    """The database was written by a newer llmgw."""

    def __init__(self, where: str, found: int) -> None:
        super().__init__(
            f"{where} has schema version {found}, newer than this llmgw understands "
            f"({LATEST}); upgrade llmgw (or point it at another store)"
        )
        self.found = found


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "keys and usage",
        sqlite="""
CREATE TABLE IF NOT EXISTS keys (
    id          TEXT PRIMARY KEY,      -- public part of the key, printed by `keys list`
    digest      TEXT NOT NULL,         -- SHA-256 of the whole key, hex (see store.keys)
    project     TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
CREATE TABLE IF NOT EXISTS usage (
    id                INTEGER PRIMARY KEY,
    ts                REAL NOT NULL,
    project           TEXT,            -- NULL under `auth: none`
    key_id            TEXT,
    model             TEXT NOT NULL,
    endpoint          TEXT NOT NULL,   -- /v1/chat/completions, ...
    status            INTEGER NOT NULL,
    prompt_tokens     INTEGER,         -- NULL when the engine reported no usage
    completion_tokens INTEGER,
    latency_ms        REAL NOT NULL,
    cost_usd          REAL NOT NULL DEFAULT 0,
    stream            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_project ON usage (project);
CREATE INDEX IF NOT EXISTS usage_key ON usage (key_id, ts);
""",
        postgres="""
CREATE TABLE keys (
    id          TEXT PRIMARY KEY,
    digest      TEXT NOT NULL,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    created_at  DOUBLE PRECISION NOT NULL,
    revoked_at  DOUBLE PRECISION
);
CREATE TABLE usage (
    id                BIGSERIAL PRIMARY KEY,
    ts                DOUBLE PRECISION NOT NULL,
    project           TEXT,
    key_id            TEXT,
    model             TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    status            INTEGER NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    latency_ms        DOUBLE PRECISION NOT NULL,
    cost_usd          DOUBLE PRECISION NOT NULL DEFAULT 0,
    stream            BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX usage_project ON usage (project);
CREATE INDEX usage_key ON usage (key_id, ts);
""",
    ),
    Migration(
        2, "leader lease",
        # expires_at is in the database's clock: seconds since the epoch on SQLite (one
        # machine, one clock), timestamptz from now() on PostgreSQL (every reconciler
        # compares against the same clock, never its own).
        sqlite="""
CREATE TABLE IF NOT EXISTS leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    expires_at  REAL NOT NULL
);
""",
        postgres="""
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);
""",
    ),
    Migration(
        3, "copies between stores",
        # `llmgw store migrate`: which source filled this store, up to which usage row, so
        # a second run tops up what a running daemon wrote meanwhile instead of refusing.
        sqlite="""
CREATE TABLE IF NOT EXISTS store_copies (
    source         TEXT PRIMARY KEY,
    last_usage_id  INTEGER NOT NULL,
    copied_at      REAL NOT NULL
);
""",
        postgres="""
CREATE TABLE store_copies (
    source         TEXT PRIMARY KEY,
    last_usage_id  BIGINT NOT NULL,
    copied_at      DOUBLE PRECISION NOT NULL
);
""",
    ),
    Migration(
        4, "routes from the leader, demand from the routers",
        # The leader publishes the routing table (fenced by its lease epoch); every router
        # publishes what it has seen (requests waiting, last use). Both as JSON documents:
        # their shape is the daemon's business, not the schema's.
        sqlite="""
CREATE TABLE IF NOT EXISTS published_routes (
    name          TEXT PRIMARY KEY,
    epoch         INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    doc           TEXT NOT NULL,
    published_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS router_signals (
    router      TEXT PRIMARY KEY,
    doc         TEXT NOT NULL,
    updated_at  REAL NOT NULL
);
""",
        postgres="""
CREATE TABLE published_routes (
    name          TEXT PRIMARY KEY,
    epoch         BIGINT NOT NULL,
    seq           BIGINT NOT NULL,
    doc           TEXT NOT NULL,
    published_at  TIMESTAMPTZ NOT NULL
);
CREATE TABLE router_signals (
    router      TEXT PRIMARY KEY,
    doc         TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
""",
    ),
    Migration(
        5, "budget reservations shared by routers",
        # project_spend: running totals, kept in the transaction that inserts usage rows, so
        # admission reads one row instead of summing usage. reservations: what requests in
        # flight on any router may still cost; a row leaves in the transaction that writes
        # its request's usage row (no instant where the cost is in neither), or expires
        # when its router died.
        sqlite="""
CREATE TABLE IF NOT EXISTS project_spend (
    project  TEXT PRIMARY KEY,
    spent    REAL NOT NULL
);
INSERT OR IGNORE INTO project_spend (project, spent)
    SELECT project, SUM(cost_usd) FROM usage WHERE project IS NOT NULL GROUP BY project;
CREATE TABLE IF NOT EXISTS reservations (
    id          TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    amount      REAL NOT NULL,
    expires_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reservations_project ON reservations (project, expires_at);
""",
        postgres="""
CREATE TABLE project_spend (
    project  TEXT PRIMARY KEY,
    spent    DOUBLE PRECISION NOT NULL
);
INSERT INTO project_spend (project, spent)
    SELECT project, SUM(cost_usd) FROM usage WHERE project IS NOT NULL GROUP BY project;
CREATE TABLE reservations (
    id          TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    amount      DOUBLE PRECISION NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX reservations_project ON reservations (project, expires_at);
-- Admission in one round trip. Each statement of a VOLATILE function takes a fresh
-- snapshot, so the sum below, read after the row lock is held, sees every reservation
-- committed by the router that held the lock before us.
CREATE FUNCTION llmgw_reserve(p_project TEXT, p_budget DOUBLE PRECISION,
                              p_amount DOUBLE PRECISION, p_hold DOUBLE PRECISION,
                              p_id TEXT, OUT spent DOUBLE PRECISION,
                              OUT reserved DOUBLE PRECISION, OUT admitted BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO project_spend VALUES (p_project, 0) ON CONFLICT (project) DO NOTHING;
    SELECT s.spent INTO spent FROM project_spend s WHERE s.project = p_project FOR UPDATE;
    SELECT COALESCE(SUM(amount), 0) INTO reserved FROM reservations
        WHERE project = p_project AND expires_at > now();
    admitted := spent + reserved < p_budget;
    IF admitted THEN
        INSERT INTO reservations
            VALUES (p_id, p_project, p_amount, now() + make_interval(secs => p_hold));
    END IF;
END;
$$;
""",
    ),
    Migration(
        6, "users, sessions and conversations of the pages; usage rows name the page user",
        # Conversations hold the only prompt and answer text llmgw ever stores, and only
        # for projects that turn them on (see llmgw.store.conversations).
        sqlite="""
CREATE TABLE IF NOT EXISTS users (
    name        TEXT PRIMARY KEY,
    password    TEXT NOT NULL,        -- argon2id encoded hash
    admin       INTEGER NOT NULL DEFAULT 0,
    projects    TEXT NOT NULL DEFAULT '[]',   -- JSON list of project names
    created_at  REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    digest      TEXT PRIMARY KEY,     -- SHA-256 of the cookie's token, hex
    user_name   TEXT NOT NULL,
    csrf        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_user ON sessions (user_name);

CREATE TABLE IF NOT EXISTS conversations (
    id          TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    project     TEXT NOT NULL,
    title       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_user ON conversations (user_name, updated_at);
CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY,
    conversation    TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role            TEXT NOT NULL,
    content         TEXT NOT NULL,
    ts              REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages (conversation, id);
ALTER TABLE usage ADD COLUMN user_name TEXT;
""",
        postgres="""
CREATE TABLE users (
    name        TEXT PRIMARY KEY,
    password    TEXT NOT NULL,        -- argon2id encoded hash
    admin       BOOLEAN NOT NULL DEFAULT FALSE,
    projects    TEXT NOT NULL DEFAULT '[]',   -- JSON list of project names
    created_at  DOUBLE PRECISION NOT NULL
);

CREATE TABLE sessions (
    digest      TEXT PRIMARY KEY,     -- SHA-256 of the cookie's token, hex
    user_name   TEXT NOT NULL,
    csrf        TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_name);

CREATE TABLE conversations (
    id          TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    project     TEXT NOT NULL,
    title       TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX conversations_user ON conversations (user_name, updated_at);
CREATE TABLE messages (
    id              BIGSERIAL PRIMARY KEY,
    conversation    TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role            TEXT NOT NULL,
    content         TEXT NOT NULL,
    ts              DOUBLE PRECISION NOT NULL
);
CREATE INDEX messages_conversation ON messages (conversation, id);
ALTER TABLE usage ADD COLUMN user_name TEXT;
""",
    ),
    Migration(
        7, "the apply journal (llmgw history)",
        sqlite="""
CREATE TABLE IF NOT EXISTS applies (
    id          INTEGER PRIMARY KEY,
    started_at  REAL NOT NULL,       -- Unix time
    duration    REAL NOT NULL,       -- seconds
    revision    TEXT,                -- the cluster directory's git revision, when known
    started_by  TEXT NOT NULL,       -- "daemon", or user@host for `llmgw apply`
    ok          BOOLEAN NOT NULL,
    gate        TEXT,                -- coming with gated rollouts: the gate's verdict
    rollback_of INTEGER              -- coming with gated rollouts: the apply rolled back
);
CREATE TABLE IF NOT EXISTS apply_changes (
    apply_id    INTEGER NOT NULL REFERENCES applies (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,    -- order within the apply
    model       TEXT NOT NULL,
    replica     INTEGER NOT NULL,
    action      TEXT NOT NULL,       -- create, replace, restart, destroy
    nodes       TEXT NOT NULL,       -- comma-separated node names
    why         TEXT NOT NULL,       -- the plan's reasons, never a secret
    ok          BOOLEAN NOT NULL,
    error       TEXT,                -- failed: the reason and the engine's last log line
    duration    REAL,
    new_replica INTEGER,             -- a replace: the replica that replaces this one
    class       TEXT,                -- coming with classified drift
    gate        TEXT,                -- coming with gated rollouts
    rolled_back BOOLEAN,             -- coming with gated rollouts
    PRIMARY KEY (apply_id, seq)
);
CREATE INDEX IF NOT EXISTS apply_changes_model ON apply_changes (model, apply_id);
""",
        postgres="""
CREATE TABLE applies (
    id          BIGSERIAL PRIMARY KEY,
    started_at  DOUBLE PRECISION NOT NULL, -- Unix time
    duration    DOUBLE PRECISION NOT NULL, -- seconds
    revision    TEXT,                -- the cluster directory's git revision, when known
    started_by  TEXT NOT NULL,       -- "daemon", or user@host for `llmgw apply`
    ok          BOOLEAN NOT NULL,
    gate        TEXT,                -- coming with gated rollouts: the gate's verdict
    rollback_of BIGINT               -- coming with gated rollouts: the apply rolled back
);
CREATE TABLE apply_changes (
    apply_id    BIGINT NOT NULL REFERENCES applies (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,    -- order within the apply
    model       TEXT NOT NULL,
    replica     INTEGER NOT NULL,
    action      TEXT NOT NULL,       -- create, replace, restart, destroy
    nodes       TEXT NOT NULL,       -- comma-separated node names
    why         TEXT NOT NULL,       -- the plan's reasons, never a secret
    ok          BOOLEAN NOT NULL,
    error       TEXT,                -- failed: the reason and the engine's last log line
    duration    DOUBLE PRECISION,
    new_replica INTEGER,             -- a replace: the replica that replaces this one
    class       TEXT,                -- coming with classified drift
    gate        TEXT,                -- coming with gated rollouts
    rolled_back BOOLEAN,             -- coming with gated rollouts
    PRIMARY KEY (apply_id, seq)
);
CREATE INDEX apply_changes_model ON apply_changes (model, apply_id);
""",
    ),
    Migration(
        8, "held revisions (rollout gates)",
        sqlite="""
CREATE TABLE IF NOT EXISTS holds (
    model    TEXT PRIMARY KEY,       -- the model whose replacement failed its gate
    digest   TEXT NOT NULL,          -- of the model's spec that failed
    revision TEXT,                   -- the cluster directory's git revision, when known
    reason   TEXT NOT NULL,          -- the gate's verdict
    held_at  REAL NOT NULL           -- Unix time
);
""",
        postgres="""
CREATE TABLE holds (
    model    TEXT PRIMARY KEY,       -- the model whose replacement failed its gate
    digest   TEXT NOT NULL,          -- of the model's spec that failed
    revision TEXT,                   -- the cluster directory's git revision, when known
    reason   TEXT NOT NULL,          -- the gate's verdict
    held_at  DOUBLE PRECISION NOT NULL -- Unix time
);
""",
    ),
    Migration(
        9, "reservations owned by live routers (heartbeats) and billed from their progress",
        # A reservation names its router and what to bill if that router dies; the router
        # records what its request produced as it goes, and renews its heartbeat row. A
        # released row stays (amount 0, released_at set) until its request's own usage row
        # arrives, which then bills only the rest. See llmgw.store.reservations.
        sqlite="""
ALTER TABLE reservations ADD COLUMN router TEXT;
ALTER TABLE reservations ADD COLUMN key_id TEXT;
ALTER TABLE reservations ADD COLUMN model TEXT;
ALTER TABLE reservations ADD COLUMN endpoint TEXT;
ALTER TABLE reservations ADD COLUMN stream BOOLEAN NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN user_name TEXT;
ALTER TABLE reservations ADD COLUMN created_at REAL;
ALTER TABLE reservations ADD COLUMN prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN completion_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN used REAL NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN released_at REAL;
CREATE INDEX IF NOT EXISTS reservations_router ON reservations (router);
CREATE TABLE IF NOT EXISTS router_heartbeats (
    router      TEXT PRIMARY KEY,
    expires_at  REAL NOT NULL        -- Unix time, as the router states it (3 intervals ahead)
);
""",
        postgres="""
ALTER TABLE reservations ADD COLUMN router TEXT;
ALTER TABLE reservations ADD COLUMN key_id TEXT;
ALTER TABLE reservations ADD COLUMN model TEXT;
ALTER TABLE reservations ADD COLUMN endpoint TEXT;
ALTER TABLE reservations ADD COLUMN stream BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE reservations ADD COLUMN user_name TEXT;
ALTER TABLE reservations ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT now();
ALTER TABLE reservations ADD COLUMN prompt_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN completion_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN used DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN released_at TIMESTAMPTZ;
CREATE INDEX reservations_router ON reservations (router);
CREATE TABLE router_heartbeats (
    router      TEXT PRIMARY KEY,
    expires_at  TIMESTAMPTZ NOT NULL -- by the database clock, 3 intervals ahead
);
DROP FUNCTION llmgw_reserve(TEXT, DOUBLE PRECISION, DOUBLE PRECISION, DOUBLE PRECISION, TEXT);
CREATE FUNCTION llmgw_reserve(p_project TEXT, p_budget DOUBLE PRECISION,
                              p_amount DOUBLE PRECISION, p_hold DOUBLE PRECISION,
                              p_id TEXT, p_router TEXT, p_key TEXT, p_model TEXT,
                              p_endpoint TEXT, p_stream BOOLEAN, p_user TEXT,
                              OUT spent DOUBLE PRECISION,
                              OUT reserved DOUBLE PRECISION, OUT admitted BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO project_spend VALUES (p_project, 0) ON CONFLICT (project) DO NOTHING;
    SELECT s.spent INTO spent FROM project_spend s WHERE s.project = p_project FOR UPDATE;
    SELECT COALESCE(SUM(amount), 0) INTO reserved FROM reservations
        WHERE project = p_project AND expires_at > now();
    admitted := spent + reserved < p_budget;
    IF admitted THEN
        INSERT INTO reservations (id, project, amount, expires_at, router, key_id, model,
                                  endpoint, stream, user_name)
            VALUES (p_id, p_project, p_amount, now() + make_interval(secs => p_hold),
                    p_router, p_key, p_model, p_endpoint, p_stream, p_user);
    END IF;
END;
$$;
""",
    ),
    Migration(
        10, "the leader's admin summary, for routers' pages",
        # What /admin shows (the fleet, scrubbed; the plan; the last apply), published by the
        # leading reconciler for routers in other processes, fenced by its lease like the
        # routes. A JSON document: its shape is the daemon's business, not the schema's.
        sqlite="""
CREATE TABLE IF NOT EXISTS published_summaries (
    name          TEXT PRIMARY KEY,  -- the lease it is published under
    holder        TEXT NOT NULL,     -- the reconciler that wrote it
    epoch         INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    doc           TEXT NOT NULL,
    published_at  REAL NOT NULL
);
""",
        postgres="""
CREATE TABLE published_summaries (
    name          TEXT PRIMARY KEY,
    holder        TEXT NOT NULL,
    epoch         BIGINT NOT NULL,
    seq           BIGINT NOT NULL,
    doc           TEXT NOT NULL,
    published_at  TIMESTAMPTZ NOT NULL
);
""",
    ),
    Migration(
        11, "single sign-on: users bound to their OpenID provider's subject",
        # A person who signs in through the provider is the row whose subject is theirs
        # ("<issuer> <sub>"), never a local account that happens to share the name; their
        # password is '' (no Argon2 hash verifies against it: no local login).
        sqlite="""
ALTER TABLE users ADD COLUMN subject TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS users_subject ON users (subject);
""",
        postgres="""
ALTER TABLE users ADD COLUMN subject TEXT;
CREATE UNIQUE INDEX users_subject ON users (subject);
""",
    ),
    Migration(
        12, "rate limits: rpm and tpm on keys, and per-minute counters shared by routers",
        # A key's own requests and tokens per minute (NULL: only its project's limits), and
        # one row per counter and minute that every router's admission adds to atomically
        # (llmgw.store.ratelimits). ``slot`` is the minute: floor(Unix time / 60).
        sqlite="""
ALTER TABLE keys ADD COLUMN rpm INTEGER;
ALTER TABLE keys ADD COLUMN tpm INTEGER;
CREATE TABLE IF NOT EXISTS rate_counts (
    name  TEXT NOT NULL,             -- p:<project>:requests, k:<key id>:tokens, ...
    slot  INTEGER NOT NULL,          -- the minute counted
    used  INTEGER NOT NULL,
    PRIMARY KEY (name, slot)
);
""",
        postgres="""
ALTER TABLE keys ADD COLUMN rpm BIGINT;
ALTER TABLE keys ADD COLUMN tpm BIGINT;
CREATE TABLE rate_counts (
    name  TEXT NOT NULL,
    slot  BIGINT NOT NULL,
    used  BIGINT NOT NULL,
    PRIMARY KEY (name, slot)
);
-- Add every amount to its counter of the minute, in the order given (callers sort the
-- names, so two admissions lock rows in one order); when any counter passes its limit,
-- take every amount back before the statement ends: no other admission ever sees it.
CREATE FUNCTION llmgw_take_rate(p_slot BIGINT, p_names TEXT[], p_limits BIGINT[],
                                p_amounts BIGINT[], OUT used BIGINT[], OUT admitted BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i INTEGER;
    v BIGINT;
BEGIN
    admitted := true;
    used := '{}';
    FOR i IN 1 .. COALESCE(array_length(p_names, 1), 0) LOOP
        INSERT INTO rate_counts AS c (name, slot, used) VALUES (p_names[i], p_slot, p_amounts[i])
            ON CONFLICT (name, slot) DO UPDATE SET used = c.used + EXCLUDED.used
            RETURNING c.used INTO v;
        used := used || v;
        IF v > p_limits[i] THEN
            admitted := false;
        END IF;
    END LOOP;
    IF NOT admitted THEN
        FOR i IN 1 .. array_length(p_names, 1) LOOP
            UPDATE rate_counts SET used = rate_counts.used - p_amounts[i]
                WHERE name = p_names[i] AND slot = p_slot;
            used[i] := used[i] - p_amounts[i];
        END LOOP;
    END IF;
    DELETE FROM rate_counts WHERE name = ANY(p_names) AND slot < p_slot - 1;
END;
$$;
""",
    ),
    Migration(
        13, "the audit log of changes to keys, users and members, and of logins",
        # Written by llmgw.store.audits.record only: identifiers, never a secret or client
        # text. Deleted past cluster.audit.retention by the daemon's housekeeping.
        sqlite="""
CREATE TABLE IF NOT EXISTS audit_log (
    id      INTEGER PRIMARY KEY,
    at      REAL NOT NULL,          -- Unix time
    actor   TEXT NOT NULL,          -- a user name, cli:<unix user>, key:<id>, admin-token
    source  TEXT NOT NULL,          -- the client's address, or cli
    action  TEXT NOT NULL,          -- key.create, login.failed, ...
    target  TEXT NOT NULL           -- key=ID project=P: validated identifiers only
);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log (at);
""",
        postgres="""
CREATE TABLE audit_log (
    id      BIGSERIAL PRIMARY KEY,
    at      DOUBLE PRECISION NOT NULL, -- Unix time
    actor   TEXT NOT NULL,
    source  TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at);
""",
    ),
    Migration(
        14, "key owners and per-project roles (members see their own keys)",
        # keys.owner: the page user who created the key on /account; NULL for keys made by
        # `llmgw keys create`, which only project admins and admins see. users.admin_of:
        # the user's projects where they are a project admin (a JSON list, a subset of
        # `projects`); every other project of theirs they are a plain member of.
        sqlite="""
ALTER TABLE keys ADD COLUMN owner TEXT;
ALTER TABLE users ADD COLUMN admin_of TEXT NOT NULL DEFAULT '[]';
CREATE INDEX IF NOT EXISTS keys_owner ON keys (project, owner);
""",
        postgres="""
ALTER TABLE keys ADD COLUMN owner TEXT;
ALTER TABLE users ADD COLUMN admin_of TEXT NOT NULL DEFAULT '[]';
CREATE INDEX keys_owner ON keys (project, owner);
""",
    ),
    Migration(
        15, "budget periods: spend in quarter-hour buckets, reservations' request time",
        # spend_buckets: a project's cost per 900 s of usage ts (llmgw.store.spends), kept
        # with project_spend, so admission sums at most a month of buckets for a period's
        # spend. reservations.started: the request's arrival by its router's clock, its
        # usage row's ts: a reservation counts in the period it was taken, and a release
        # bills it there. The bucket of a row: 900 * floor(ts / 900), corrected where the
        # division rounded, as spends.bucket computes it.
        sqlite="""
ALTER TABLE reservations ADD COLUMN started REAL;
CREATE TABLE IF NOT EXISTS spend_buckets (
    project  TEXT NOT NULL,
    start    REAL NOT NULL,         -- Unix time, a multiple of 900
    spent    REAL NOT NULL,
    PRIMARY KEY (project, start)
);
INSERT INTO spend_buckets (project, start, spent)
    SELECT project, CASE WHEN c > ts THEN c - 900 WHEN c + 900 <= ts THEN c + 900 ELSE c END
           AS b, SUM(cost_usd)
    FROM (SELECT project, ts, cost_usd, CAST(ts / 900 AS INTEGER) * 900.0 AS c FROM usage
          WHERE project IS NOT NULL AND cost_usd != 0)
    GROUP BY project, b;
CREATE INDEX IF NOT EXISTS usage_project_ts ON usage (project, ts);
""",
        postgres="""
ALTER TABLE reservations ADD COLUMN started DOUBLE PRECISION;
CREATE TABLE spend_buckets (
    project  TEXT NOT NULL,
    start    DOUBLE PRECISION NOT NULL,
    spent    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (project, start)
);
INSERT INTO spend_buckets (project, start, spent)
    SELECT project, b, SUM(cost_usd) FROM (
        SELECT project, cost_usd,
               CASE WHEN c > ts THEN c - 900 WHEN c + 900 <= ts THEN c + 900 ELSE c END AS b
        FROM (SELECT project, ts, cost_usd, floor(ts / 900) * 900 AS c FROM usage
              WHERE project IS NOT NULL AND cost_usd <> 0) u) v
    GROUP BY project, b;
CREATE INDEX usage_project_ts ON usage (project, ts);
CREATE FUNCTION llmgw_spent_since(p_project TEXT, p_since DOUBLE PRECISION)
    RETURNS DOUBLE PRECISION LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    edge DOUBLE PRECISION := ceil(p_since / 900) * 900;
BEGIN
    IF edge < p_since THEN
        edge := edge + 900;
    END IF;
    RETURN COALESCE((SELECT SUM(b.spent) FROM spend_buckets b
                     WHERE b.project = p_project AND b.start >= edge), 0)
         + COALESCE((SELECT SUM(u.cost_usd) FROM usage u
                     WHERE u.project = p_project AND u.ts >= p_since AND u.ts < edge), 0);
END;
$$;
DROP FUNCTION llmgw_reserve(TEXT, DOUBLE PRECISION, DOUBLE PRECISION, DOUBLE PRECISION, TEXT,
                            TEXT, TEXT, TEXT, TEXT, BOOLEAN, TEXT);
-- p_since: the period's start (NULL: lifetime). The project's spend row is locked either
-- way, so admissions of one project take turns; reservations taken in an earlier period
-- (started before p_since) count in theirs, not in this one.
CREATE FUNCTION llmgw_reserve(p_project TEXT, p_budget DOUBLE PRECISION,
                              p_amount DOUBLE PRECISION, p_hold DOUBLE PRECISION,
                              p_id TEXT, p_router TEXT, p_key TEXT, p_model TEXT,
                              p_endpoint TEXT, p_stream BOOLEAN, p_user TEXT,
                              p_since DOUBLE PRECISION, p_started DOUBLE PRECISION,
                              OUT spent DOUBLE PRECISION,
                              OUT reserved DOUBLE PRECISION, OUT admitted BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO project_spend VALUES (p_project, 0) ON CONFLICT (project) DO NOTHING;
    SELECT s.spent INTO spent FROM project_spend s WHERE s.project = p_project FOR UPDATE;
    IF p_since IS NOT NULL THEN
        spent := llmgw_spent_since(p_project, p_since);
    END IF;
    SELECT COALESCE(SUM(r.amount), 0) INTO reserved FROM reservations r
        WHERE r.project = p_project AND r.expires_at > now()
          AND (p_since IS NULL OR r.started IS NULL OR r.started >= p_since);
    admitted := spent + reserved < p_budget;
    IF admitted THEN
        INSERT INTO reservations (id, project, amount, expires_at, router, key_id, model,
                                  endpoint, stream, user_name, started)
            VALUES (p_id, p_project, p_amount, now() + make_interval(secs => p_hold),
                    p_router, p_key, p_model, p_endpoint, p_stream, p_user, p_started);
    END IF;
END;
$$;
""",
    ),
    Migration(
        16, "notes: a person's own notes beside /chat",
        # Private to their user (every query names it), deleted with the user, and in the
        # person's data export (llmgw.store.notes).
        sqlite="""
CREATE TABLE IF NOT EXISTS notes (
    id          TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    title       TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_user ON notes (user_name, updated_at);
""",
        postgres="""
CREATE TABLE notes (
    id          TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    title       TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX notes_user ON notes (user_name, updated_at);
""",
    ),
    Migration(
        17, "copies between stores: how far each appended table was copied",
        # `llmgw store migrate` copies every table (llmgw.store.tables); a top-up appends
        # the rows of append-only tables (usage, audit_log, applies, messages) past the
        # last id copied from that source: {"usage": 7000, "audit_log": 12, ...}.
        sqlite="""
ALTER TABLE store_copies ADD COLUMN marks TEXT NOT NULL DEFAULT '{}';
""",
        postgres="""
ALTER TABLE store_copies ADD COLUMN marks TEXT NOT NULL DEFAULT '{}';
""",
    ),
    Migration(
        18, "usage rows say which upstream served them (upstreams:, issue 29); NULL: a replica",
        sqlite="""
ALTER TABLE usage ADD COLUMN upstream TEXT;
""",
        postgres="""
ALTER TABLE usage ADD COLUMN upstream TEXT;
""",
    ),
    Migration(
        19, "routers through a store outage: usage rows' request ids, keys' change notices",
        sqlite="""
ALTER TABLE usage ADD COLUMN request_id TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS usage_request ON usage (request_id)
    WHERE request_id IS NOT NULL;
""",
        postgres="""
ALTER TABLE usage ADD COLUMN request_id TEXT;
CREATE UNIQUE INDEX usage_request ON usage (request_id) WHERE request_id IS NOT NULL;
-- Every change to a key (created, revoked, deleted) tells the routers listening on
-- llmgw_keys which key id to read again (llmgw.store.outages), at commit.
CREATE FUNCTION llmgw_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('llmgw_keys', CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END);
    RETURN NULL;
END;
$$;
CREATE TRIGGER keys_changed AFTER INSERT OR UPDATE OR DELETE ON keys
    FOR EACH ROW EXECUTE FUNCTION llmgw_key_changed();
""",
    ),
)

LATEST = MIGRATIONS[-1].version


def pending(found: int, where: str) -> list[Migration]:
    """The migrations to run on a database at version ``found``; SchemaTooNew if newer."""
    if found > LATEST:
        raise SchemaTooNew(where, found)
    return [m for m in MIGRATIONS if m.version > found]
