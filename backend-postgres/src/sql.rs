//! Every statement this backend sends, for one table.
//!
//! A name's advisory lock key is `hashtextextended(name, 0)`, computed by
//! the server, so that any client shares a name with
//! `SELECT pg_advisory_lock(hashtextextended('NAME', 0))`. A row per name
//! in the table keeps its fencing counter and, while a client of this
//! library holds it, the holder's owner token, server process id, since
//! and value.

use std::time::Duration;

/// A ttl as the `idle_session_timeout` it sets, in milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().max(1).to_string()
}

/// `table` as it is written in a statement: quoted, so that a word SQL
/// reserves (`user`, `order`) names a table like any other, and in lower
/// case, so that it names the table the same name unquoted does.
pub(crate) fn ident(table: &str) -> String {
    format!("\"{}\"", table.to_ascii_lowercase().replace('"', "\"\""))
}

/// The fencing token of a new holder: one more than the name's counter,
/// and at least the server's clock in microseconds (a counter that went
/// back, a table restored from a backup, still gives rising tokens).
const NEXT_FENCE: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// Whether `pg_locks` row `l` is the advisory lock on the key of the
/// name `name` (an SQL expression) with `seed`, split as `pg_locks` shows
/// a 64-bit key: `classid` the high half, `objid` the low one, `objsubid` 1.
fn key_matches(name: &str, seed: u8) -> String {
    format!(
        "l.locktype = 'advisory' AND l.objsubid = 1 \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND l.classid = ((hashtextextended({name}, {seed}) >> 32) & 4294967295)::bigint::oid \
         AND l.objid = (hashtextextended({name}, {seed}) & 4294967295)::bigint::oid"
    )
}

/// How a name is taken: its advisory lock (the key's seed, shared or
/// not) and its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock or an election: `hashtextextended(name, 0)`, exclusive; the
    /// row `name`.
    Lock,
    /// A read-write lock's writer: `hashtextextended(name, 1)`, exclusive;
    /// the row `name || chr(1) || 'rw'`.
    Writer,
    /// A read-write lock's reader: `hashtextextended(name, 1)`, shared; it
    /// advances the writer's row's counter and names no holder.
    Reader,
}

impl Kind {
    /// The row of `name` for this kind.
    pub(crate) fn row(self, name: &str) -> String {
        match self {
            Kind::Lock => name.to_owned(),
            Kind::Writer | Kind::Reader => format!("{name}\u{1}rw"),
        }
    }
}

/// The statements of one kind of taking.
#[derive(Debug, Clone)]
pub(crate) struct Taking {
    /// Tries the lock of `$1` (its row `$5`) for owner `$2` with value
    /// `$3`; when it is taken, in the same statement, advances the fencing
    /// counter, writes the holder's row (committed before the answer) and
    /// sets the session's `idle_session_timeout` to `$4` ms. Answers
    /// `(taken, fence, _)`.
    pub(crate) try_lock: String,
    /// Waits in the server's queue for the lock of `$1`, at most `$2` ms
    /// (`lock_timeout`, 0: no bound), and sets `lock_timeout` back to 0
    /// once it holds it. The session's `idle_session_timeout` is the ttl
    /// (`$3` ms) from before the wait (rolled back with a wait that fails):
    /// a waiter granted the lock that never comes back for it (frozen,
    /// gone) loses it within the ttl.
    pub(crate) wait_lock: String,
    /// After [`Taking::wait_lock`]: the counter and the holder's row as
    /// [`Taking::try_lock`] writes them (same parameters), and the idle
    /// timeout. Answers `(fence, _)`.
    pub(crate) granted: String,
    /// Releases the lock of `$1` (its row `$3`) held by owner `$2`: the
    /// row forgets its holder and value, the session its idle timeout.
    /// Answers `(held, _)`.
    pub(crate) release: String,
}

impl Taking {
    /// The statements of `kind` on `table`, an identifier as [`ident`]
    /// writes it.
    fn new(table: &str, kind: Kind) -> Self {
        let (seed, shared) = match kind {
            Kind::Lock => (0, ""),
            Kind::Writer => (1, ""),
            Kind::Reader => (1, "_shared"),
        };
        let key = format!("hashtextextended($1, {seed})");
        // The row's counter advanced, and for a holder alone its owner ($2),
        // server process and value ($3); rows taken `from` (with the
        // condition it carries).
        let upsert = |from: &str| {
            match kind {
            Kind::Lock | Kind::Writer => format!(
                "INSERT INTO {table} AS t (name, fence, owner, pid, since, value) \
                 SELECT $5, {NEXT_FENCE}, $2, pg_backend_pid(), clock_timestamp(), $3 {from} \
                 ON CONFLICT (name) DO UPDATE SET fence = GREATEST(t.fence + 1, EXCLUDED.fence), \
                 owner = EXCLUDED.owner, pid = EXCLUDED.pid, since = EXCLUDED.since, value = EXCLUDED.value \
                 RETURNING t.fence"
            ),
            Kind::Reader => format!(
                "INSERT INTO {table} AS t (name, fence) SELECT $5, {NEXT_FENCE} {from} \
                 ON CONFLICT (name) DO UPDATE SET fence = GREATEST(t.fence + 1, EXCLUDED.fence) \
                 RETURNING t.fence"
            ),
        }
        };
        let release = match kind {
            Kind::Lock | Kind::Writer => format!(
                "WITH r AS (UPDATE {table} SET pid = NULL, value = NULL WHERE name = $3 AND owner = $2) \
                 SELECT pg_advisory_unlock({key}), set_config('idle_session_timeout', '0', false)"
            ),
            Kind::Reader => format!(
                "SELECT pg_advisory_unlock_shared({key}), set_config('idle_session_timeout', '0', false)"
            ),
        };
        Taking {
            try_lock: format!(
                "WITH l AS (SELECT pg_try_advisory_lock{shared}({key}) AS got), \
                 u AS ({}) \
                 SELECT l.got, (SELECT fence FROM u), \
                 CASE WHEN l.got THEN set_config('idle_session_timeout', $4, false) END FROM l",
                upsert("FROM l WHERE l.got")
            ),
            wait_lock: format!(
                "SELECT set_config('lock_timeout', '0', false) FROM \
                 (SELECT pg_advisory_lock{shared}({key}) FROM \
                 (SELECT set_config('lock_timeout', $2, false), \
                 set_config('idle_session_timeout', $3, false) OFFSET 0) a OFFSET 0) x"
            ),
            granted: format!(
                "WITH u AS ({}) SELECT (SELECT fence FROM u), set_config('idle_session_timeout', $4, false)",
                upsert("")
            ),
            release,
        }
    }
}

/// The statements of one table.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    /// Creates the table if missing.
    pub(crate) schema: String,
    /// A lock's statements.
    pub(crate) lock: Taking,
    /// A read-write lock's writer's.
    pub(crate) writer: Taking,
    /// A read-write lock's reader's.
    pub(crate) reader: Taking,
    /// Renews: the session's idle timeout to `$1` ms.
    pub(crate) renew: &'static str,
    /// The holder and the waiters of lock `$1`, from `pg_locks`:
    /// `(granted, pid, mode)`.
    pub(crate) lockers: String,
    /// The same of read-write lock `$1`.
    pub(crate) rw_lockers: String,
    /// The row `$1` if it names server process `$2` as holding it:
    /// `(owner, fence, value, since)`.
    pub(crate) holder_row: String,
    /// Names that start with `$1` (a `LIKE` pattern) held by a client of
    /// this library now, at most `$2`.
    pub(crate) list: String,
}

impl Sql {
    /// The statements of `table` (already checked to be a plain name).
    pub(crate) fn new(table: &str) -> Self {
        let table = &ident(table);
        let lockers = "SELECT l.granted, l.pid, l.mode FROM pg_locks l WHERE ";
        Sql {
            schema: format!(
                "CREATE TABLE IF NOT EXISTS {table} (name text COLLATE \"C\" PRIMARY KEY, \
                 fence bigint NOT NULL, owner text, pid integer, since timestamptz, value text)"
            ),
            lock: Taking::new(table, Kind::Lock),
            writer: Taking::new(table, Kind::Writer),
            reader: Taking::new(table, Kind::Reader),
            renew: "SELECT set_config('idle_session_timeout', $1, false)",
            lockers: format!("{lockers}{}", key_matches("$1", 0)),
            rw_lockers: format!("{lockers}{}", key_matches("$1", 1)),
            holder_row: format!(
                "SELECT owner, fence, value, \
                 floor(extract(epoch FROM since) * 1000)::bigint FROM {table} \
                 WHERE name = $1 AND pid = $2 AND owner IS NOT NULL"
            ),
            list: format!(
                "SELECT t.name FROM {table} t WHERE t.name LIKE $1 AND t.pid IS NOT NULL \
                 AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.granted AND l.pid = t.pid \
                 AND {}) LIMIT $2",
                key_matches("t.name", 0)
            ),
        }
    }

    /// The statements of `kind`.
    pub(crate) fn taking(&self, kind: Kind) -> &Taking {
        match kind {
            Kind::Lock => &self.lock,
            Kind::Writer => &self.writer,
            Kind::Reader => &self.reader,
        }
    }
}

/// `prefix` as a `LIKE` pattern that matches names starting with it
/// (`%`, `_` and `\` taken literally).
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut p = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The two statements of an uncontended acquire and release of a lock in
/// `table`, as this backend sends them (for a DBA, and for the benchmark
/// that runs them on raw sqlx): the try, with parameters name, owner,
/// value, idle timeout in ms and the name's row (the name itself, for a
/// lock), answering `(taken, fence, _)`; the release, with parameters
/// name, owner and row, answering `(released, _)`. `table` is written as
/// [`schema_sql`] writes it.
///
/// ```
/// let (try_lock, release) = lockcore_postgres::lock_statements("lockcore_locks");
/// assert!(try_lock.contains("pg_try_advisory_lock(hashtextextended($1, 0))"));
/// assert!(release.contains("pg_advisory_unlock(hashtextextended($1, 0))"));
/// ```
pub fn lock_statements(table: &str) -> (String, String) {
    let s = Sql::new(table);
    (s.lock.try_lock, s.lock.release)
}

/// The SQL that [`connect`](crate::connect) runs with `ensure_schema` (the
/// default), for a DBA who creates the table in advance. `table` is one
/// name (letters, digits and `_`, as the URL's `table=` takes it), written
/// quoted and in lower case: `MyLocks` is the table `mylocks`, and a name
/// with a schema (`app.locks`) is not one (set the user's search_path).
///
/// ```
/// let ddl = lockcore_postgres::schema_sql("lockcore_locks");
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "lockcore_locks""#));
/// ```
pub fn schema_sql(table: &str) -> String {
    Sql::new(table).schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_name_is_quoted_in_lower_case() {
        assert_eq!(ident("lockcore_locks"), "\"lockcore_locks\"");
        // Unquoted, PostgreSQL folds a name to lower case: the same table.
        assert_eq!(ident("MyLocks"), "\"mylocks\"");
        assert_eq!(ident("user"), "\"user\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert!(schema_sql("order").contains("CREATE TABLE IF NOT EXISTS \"order\" ("));
    }
}
