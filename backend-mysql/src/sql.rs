//! The statements, built once per backend (table names are checked
//! identifiers, quoted; lock names are always bound parameters), and the
//! schema.

use std::sync::Arc;

use lockcore::{Error, Result};

use crate::config::{check_table, NAME};

/// Every lock connection's session: no gap locks on a missing row, and no
/// shared locks for the existence check of a new name.
pub(crate) const SESSION_SETUP: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Every auxiliary connection's session: inspection reads a holder's
/// record in its counter row before it commits (it never does).
pub(crate) const AUX_SESSION_SETUP: &str =
    "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED";

/// The server's clock in microseconds since the epoch, UTC (one value
/// for the whole statement): the floor of every fencing token.
pub(crate) const CLOCK_US: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) AS UNSIGNED)";

/// How long one server-side lock wait lasts when waiting forever; the wait
/// is renewed after each, so a silent server is noticed.
pub(crate) const FOREVER_CHUNK_SECS: u64 = 30;

/// Statements that name no table of ours.
pub(crate) mod waits {
    /// The connection ids holding a lock that blocks a waiter's request, not
    /// waiting themselves (MariaDB, and MySQL before 8): the holders, not
    /// the waiters queued ahead.
    pub(crate) const BLOCKERS_MARIADB: &str = "SELECT CAST(b.trx_mysql_thread_id AS UNSIGNED) \
         FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         WHERE r.trx_mysql_thread_id = ? AND b.trx_state <> 'LOCK WAIT'";
    /// The same on MySQL 8 (holders whose lock is granted).
    pub(crate) const BLOCKERS_MYSQL8: &str = "SELECT CAST(b.trx_mysql_thread_id AS UNSIGNED) \
         FROM performance_schema.data_lock_waits w \
         JOIN performance_schema.data_locks l ON l.ENGINE_LOCK_ID = w.BLOCKING_ENGINE_LOCK_ID \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID \
         WHERE r.trx_mysql_thread_id = ? AND l.LOCK_STATUS = 'GRANTED'";
}

/// The statements, built once per backend (the table names are checked
/// identifiers, quoted; lock names are always bound parameters).
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) lock_nowait: Arc<str>,
    pub(crate) lock_wait: Arc<str>,
    /// A reader's shared lock on the row, without waiting.
    pub(crate) share_nowait: Arc<str>,
    /// A reader's shared lock on the row, waiting.
    pub(crate) share_wait: Arc<str>,
    /// The first free one of the slot rows listed after it, locked (`SKIP
    /// LOCKED`): point lookups, which read no row beyond those listed.
    pub(crate) slot_free: Arc<str>,
    /// How many slot rows a range has up to a bound, and beyond it.
    pub(crate) slot_counts: Arc<str>,
    /// The slot rows in a range that no one holds for update, locked
    /// shared for a moment (`SKIP LOCKED`): two clients looking at once do
    /// not hide the rows from each other.
    pub(crate) slots_beyond_free: Arc<str>,
    pub(crate) insert_row: Arc<str>,
    /// The counter advanced on its own, committed: the clock or one more.
    pub(crate) fence: Arc<str>,
    pub(crate) holder: Arc<str>,
    /// A candidate's value and term, recorded beside the fencing counter
    /// (assignments run left to right: the value is compared with the term
    /// before the term is raised). A late write of an older term, from a
    /// candidate whose campaign was dropped, changes nothing.
    pub(crate) value: Arc<str>,
    /// The holder of a lock publishes itself: the user lock of its row
    /// (`GET_LOCK`, waiting as many seconds as bound second), and the user
    /// lock's name, for the release (no derived table: the server would
    /// make a temporary table of it each time); then, where the table of
    /// lock-delays exists, the row's lock-delay record: the microseconds
    /// left until its deadline (at the statement's start) and its owner,
    /// the row bound twice more. With that table, the row and the holder's
    /// owner are bound first: while another owner's deadline runs, no user
    /// lock is taken (the first column is -1).
    pub(crate) publish: Arc<str>,
    /// A holder with a lock-delay records its deadline: the row, the
    /// microseconds from now (the server's UTC clock), the owner.
    pub(crate) delay_set: Arc<str>,
    /// A renewal moves the deadline of its own record (recreated if gone,
    /// another owner's left alone): as [`Sql::delay_set`].
    pub(crate) delay_keep: Arc<str>,
    /// A clean release, or a successor without a lock-delay, deletes a
    /// record: the row and the record's owner.
    pub(crate) delay_clear: Arc<str>,
    /// A holder whose row's user lock is another session's takes the user
    /// lock of its term instead (`GET_LOCK` without waiting), and learns its
    /// name: bound the row and the term, twice.
    pub(crate) term_lock: Arc<str>,
    /// Who holds a lock: its fencing row, value row, the connection
    /// holding its user lock (`IS_USED_LOCK`), and the connection holding
    /// the user lock of the term the fencing row records.
    pub(crate) inspect: Arc<str>,
    /// The start of [`Sql::row_probe`], up to the row's name.
    row_probe_head: Arc<str>,
    /// The rest of [`Sql::row_probe`], after the row's name.
    row_probe_tail: Arc<str>,
    /// The lock rows from a bound lower bound (included) to a bound upper
    /// one (excluded), in name order, at most a bound count: a read that
    /// locks nothing (for listing).
    pub(crate) list_rows: Arc<str>,
    /// The lock table (a checked identifier), for the probes built with
    /// hex literals.
    table: Arc<str>,
    /// A shared lock that skips locked rows, as this server spells it.
    share_skip: &'static str,
}

/// How a probe's transaction begins: read committed, so that its locking
/// reads lock only the rows they return (no gap locks).
const PROBE_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;";

/// `bytes` as the digits of a hex literal (`X'...'`): bytes only, so safe
/// in a statement's text.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The name of a row's user lock, as a SQL expression of the row name
/// bound after it: `lockcore:` and 55 hex digits of a hash of the database,
/// the table and the row (a user lock's name is at most 64 characters, and
/// one server's user locks are shared by all its databases).
fn user_lock_name(table: &str) -> String {
    // Bytes throughout: a name need not be valid in the connection's
    // character set, nor the database's name in the name's.
    format!(
        "CONCAT('lockcore:', LEFT(SHA2(CONCAT(CAST(IFNULL(DATABASE(), '') AS BINARY), 0x00, CAST('{table}' AS BINARY), 0x00, CAST(? AS BINARY)), 256), 55))"
    )
}

/// The name of the user lock of a term: what a holder takes when the user
/// lock of its row is held by another session (see
/// `transaction::publish`), so that inspection can still tell it holds.
/// As [`user_lock_name`], of the row and the term (its fencing token), so
/// no session but that term's holder has a reason to take it: not even a
/// previous holder whose session is ending. `row` and `fence` are SQL
/// expressions (`?` for bound parameters, or columns of the fencing row).
fn term_lock_name(table: &str, row: &str, fence: &str) -> String {
    format!(
        "CONCAT('lockcore:', LEFT(SHA2(CONCAT(CAST(IFNULL(DATABASE(), '') AS BINARY), 0x00, CAST('{table}' AS BINARY), 0x00, CAST({row} AS BINARY), 0x00, CAST('term' AS BINARY), 0x00, CAST({fence} AS BINARY)), 256), 55))"
    )
}

/// Whether `name` can be the name of one of our user locks, so safe to
/// write into a statement as a literal.
pub(crate) fn is_user_lock_name(name: &str) -> bool {
    name.len() == 64
        && name.starts_with("lockcore:")
        && name["lockcore:".len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

impl Sql {
    /// The statements for `table` and `fence` on a MariaDB server
    /// (`mariadb`) or a MySQL one, which spell a shared lock without
    /// waiting differently; `values` when the table of leaders' values
    /// exists.
    pub(crate) fn new(table: &str, fence: &str, mariadb: bool, values: bool, delays: bool) -> Self {
        let value = value_table(table);
        let delay = delay_table(table);
        let user_lock = user_lock_name(table);
        let term_lock = term_lock_name(table, "?", "?");
        let recorded_term_lock = term_lock_name(table, "`f`.`name`", "`f`.`fence`");
        let (share_nowait, share_skip) = if mariadb {
            (
                "LOCK IN SHARE MODE NOWAIT",
                "LOCK IN SHARE MODE SKIP LOCKED",
            )
        } else {
            ("FOR SHARE NOWAIT", "FOR SHARE SKIP LOCKED")
        };
        Sql {
            lock_nowait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? FOR UPDATE NOWAIT")
                .into(),
            lock_wait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? FOR UPDATE").into(),
            share_nowait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? {share_nowait}")
                .into(),
            share_wait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? LOCK IN SHARE MODE")
                .into(),
            slot_free: format!("SELECT `name` FROM `{table}` WHERE `name` IN (").into(),
            slot_counts: format!(
                "SELECT CAST(SUM(`name` <= ?) AS UNSIGNED), CAST(SUM(`name` > ?) AS UNSIGNED) FROM `{table}` WHERE `name` >= ? AND `name` < ?"
            )
            .into(),
            slots_beyond_free: format!(
                "SELECT `name` FROM `{table}` WHERE `name` > ? AND `name` < ? {share_skip}"
            )
            .into(),
            insert_row: format!(
                "INSERT INTO `{table}` (`name`) SELECT ? FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM `{table}` WHERE `name` = ?)"
            )
            .into(),
            fence: format!(
                "INSERT INTO `{fence}` (`name`, `fence`, `holder_conn`, `owner`) VALUES (?, LAST_INSERT_ID({CLOCK_US}), ?, ?) \
                 ON DUPLICATE KEY UPDATE `fence` = LAST_INSERT_ID(GREATEST(`fence` + 1, {CLOCK_US})), `holder_conn` = VALUES(`holder_conn`), `owner` = VALUES(`owner`)"
            )
            .into(),
            holder: format!("SELECT `holder_conn` FROM `{fence}` WHERE `name` = ?").into(),
            value: format!(
                "INSERT INTO `{value}` (`name`, `fence`, `value`) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE `value` = IF(VALUES(`fence`) > `fence`, VALUES(`value`), `value`), \
                 `fence` = GREATEST(`fence`, VALUES(`fence`))"
            )
            .into(),
            publish: if delays {
                // No user lock while another owner's lock-delay runs (the
                // row bound, then the owner, first): -1.
                format!(
                    "SELECT CAST(IF(EXISTS(SELECT 1 FROM `{delay}` WHERE `name` = ? AND `owner` <> ? AND `until` > UTC_TIMESTAMP(6)), -1, GET_LOCK({user_lock}, ?)) AS SIGNED), {user_lock}, \
                     (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), `until`) AS SIGNED) FROM `{delay}` WHERE `name` = ?), \
                     (SELECT `owner` FROM `{delay}` WHERE `name` = ?)"
                )
            } else {
                format!("SELECT CAST(GET_LOCK({user_lock}, ?) AS SIGNED), {user_lock}, NULL, NULL")
            }
            .into(),
            delay_set: format!(
                "INSERT INTO `{delay}` (`name`, `until`, `owner`) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?) \
                 ON DUPLICATE KEY UPDATE `until` = VALUES(`until`), `owner` = VALUES(`owner`)"
            )
            .into(),
            delay_keep: format!(
                "INSERT INTO `{delay}` (`name`, `until`, `owner`) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?) \
                 ON DUPLICATE KEY UPDATE `until` = IF(`owner` = VALUES(`owner`), VALUES(`until`), `until`)"
            )
            .into(),
            delay_clear: format!("DELETE FROM `{delay}` WHERE `name` = ? AND `owner` = ?").into(),
            term_lock: format!("SELECT CAST(GET_LOCK({term_lock}, 0) AS SIGNED), {term_lock}")
                .into(),
            inspect: if values {
                format!(
                    "SELECT `f`.`fence`, `f`.`owner`, `f`.`holder_conn`, CAST(IS_USED_LOCK({user_lock}) AS UNSIGNED), `v`.`value`, `v`.`fence`, \
                     CAST(IS_USED_LOCK({recorded_term_lock}) AS UNSIGNED) \
                     FROM `{fence}` AS `f` LEFT JOIN `{value}` AS `v` ON `v`.`name` = `f`.`name` WHERE `f`.`name` = ?"
                )
            } else {
                format!(
                    "SELECT `f`.`fence`, `f`.`owner`, `f`.`holder_conn`, CAST(IS_USED_LOCK({user_lock}) AS UNSIGNED), NULL, NULL, \
                     CAST(IS_USED_LOCK({recorded_term_lock}) AS UNSIGNED) \
                     FROM `{fence}` AS `f` WHERE `f`.`name` = ?"
                )
            }
            .into(),
            // Read committed: no gap lock on a missing row.
            row_probe_head: format!(
                "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; SELECT 1 FROM `{table}` WHERE `name` = X'"
            )
            .into(),
            row_probe_tail: format!("' {share_nowait}; ROLLBACK").into(),
            list_rows: format!(
                "SELECT `name` FROM `{table}` WHERE `name` >= ? AND `name` < ? ORDER BY `name` LIMIT ?"
            )
            .into(),
            table: table.into(),
            share_skip,
        }
    }

    /// The request that tells, without waiting, which lock rows from
    /// `first` to `last` (both included) are locked: in a transaction of
    /// its own (read committed), rolled back at once, the rows of that
    /// range that no one holds for update (locked shared, skipping the
    /// locked ones), tagged 1; then, of `rw_rows` (read-write lock rows
    /// among them), those no one else holds at all (locked for update,
    /// skipping the locked ones), tagged 2. Each row comes back as its
    /// name and tag. For the moment between its reads and its rollback the
    /// request holds the free rows: a try asking for one of them then is
    /// refused once and asks again, and a try for a permit may skip a
    /// free slot. Rows are written as hex literals.
    pub(crate) fn rows_probe(&self, first: &[u8], last: &[u8], rw_rows: &[&[u8]]) -> String {
        let table = &self.table;
        let (first, last) = (hex(first), hex(last));
        let mut sql = format!(
            "{PROBE_BEGIN} SELECT `name`, CAST(1 AS SIGNED) FROM `{table}` WHERE `name` >= X'{first}' AND `name` <= X'{last}' {};",
            self.share_skip
        );
        if !rw_rows.is_empty() {
            let rows: Vec<String> = rw_rows.iter().map(|r| format!("X'{}'", hex(r))).collect();
            sql.push_str(&format!(
                " SELECT `name`, CAST(2 AS SIGNED) FROM `{table}` WHERE `name` IN ({}) FOR UPDATE SKIP LOCKED;",
                rows.join(", ")
            ));
        }
        sql.push_str(" ROLLBACK");
        sql
    }

    /// The request that tells, without waiting, which slot rows from
    /// `start` (included) to `end` (excluded) are held: every slot row,
    /// read without locking, tagged 1, and those no one holds for update
    /// (locked shared for a moment, skipping the held ones), tagged 2, in
    /// a transaction of its own rolled back at once (see
    /// [`Sql::rows_probe`]).
    pub(crate) fn slots_probe(&self, start: &[u8], end: &[u8]) -> String {
        let table = &self.table;
        let (start, end) = (hex(start), hex(end));
        let range = format!("`name` >= X'{start}' AND `name` < X'{end}'");
        format!(
            "{PROBE_BEGIN} SELECT `name`, CAST(1 AS SIGNED) FROM `{table}` WHERE {range}; \
             SELECT `name`, CAST(2 AS SIGNED) FROM `{table}` WHERE {range} {}; ROLLBACK",
            self.share_skip
        )
    }

    /// The request that tells, without waiting, how read-write lock row
    /// `row` is held: tag 1 if the row exists (read without locking), tag
    /// 2 if no one holds it for update nor waits to (it is locked shared,
    /// skipping it otherwise), tag 3 if no one else holds it at all (then
    /// locked for update, skipping it otherwise), in a transaction of its
    /// own rolled back at once (see [`Sql::rows_probe`]).
    pub(crate) fn rw_probe(&self, row: &[u8]) -> String {
        let table = &self.table;
        let at = format!("`name` = X'{}'", hex(row));
        format!(
            "{PROBE_BEGIN} SELECT CAST(1 AS SIGNED) FROM `{table}` WHERE {at}; \
             SELECT CAST(2 AS SIGNED) FROM `{table}` WHERE {at} {}; \
             SELECT CAST(3 AS SIGNED) FROM `{table}` WHERE {at} FOR UPDATE SKIP LOCKED; ROLLBACK",
            self.share_skip
        )
    }

    /// The request that asks whether some transaction holds the row of
    /// `name`, without waiting: in a transaction of its own, a shared lock
    /// on the row with `NOWAIT`, then `ROLLBACK`. Shared, so two probes at
    /// once do not refuse each other; any holder of the row (a lock's,
    /// which locks it for update, or an insert not yet committed) refuses
    /// it, with `ER_LOCK_NOWAIT` (3572) on MySQL and `ER_LOCK_WAIT_TIMEOUT`
    /// (1205) on MariaDB, whose `NOWAIT` is a lock wait of no time, and the
    /// request stops there, its transaction open: the caller rolls it back.
    /// A missing row is not locked. The name is written as a hex literal
    /// (bytes only, so safe in the text).
    pub(crate) fn row_probe(&self, name: &str) -> String {
        let hex = hex(name.as_bytes());
        format!("{}{hex}{}", self.row_probe_head, self.row_probe_tail)
    }
}

/// The table of the values candidates campaign with, beside lock table
/// `table`.
pub(crate) fn value_table(table: &str) -> String {
    format!("{table}_value")
}

/// The table of lock-delay records of lock table `table`.
pub(crate) fn delay_table(table: &str) -> String {
    format!("{table}_delay")
}

/// The `CREATE TABLE` statements of the lock table `table`, its fencing
/// counter table `<table>_fence`, the table of leaders' values
/// `<table>_value` and the table of lock-delay records `<table>_delay`,
/// for migrations.
///
/// Names are `VARBINARY(256)` primary keys, so they compare byte for byte
/// (`A` and `a`, `x` and `x `, are different names) and a `FOR UPDATE` on one
/// name locks exactly one index record.
///
/// ```
/// let ddl = lockcore_mysql::schema_sql("lockcore_locks").unwrap();
/// assert!(ddl[0].contains("VARBINARY(256)"));
/// assert!(ddl[1].contains("`lockcore_locks_fence`"));
/// assert!(ddl[2].contains("`lockcore_locks_value`"));
/// assert!(ddl[3].contains("`lockcore_locks_delay`"));
/// ```
///
/// # Errors
///
/// [`lockcore::ErrorKind::InvalidConfig`] for a table name that is not a
/// plain identifier.
pub fn schema_sql(table: &str) -> Result<[String; 4]> {
    check_table(table)
        .map_err(|why| Error::invalid_config(NAME, format!("table name {table:?}: {why}")))?;
    Ok([
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}` (\n  `name` VARBINARY(256) NOT NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}_fence` (\n  `name` VARBINARY(256) NOT NULL,\n  `fence` BIGINT UNSIGNED NOT NULL,\n  `holder_conn` BIGINT UNSIGNED NULL,\n  `owner` CHAR(32) NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}_value` (\n  `name` VARBINARY(256) NOT NULL,\n  `fence` BIGINT UNSIGNED NOT NULL,\n  `value` VARBINARY(1024) NOT NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}_delay` (\n  `name` VARBINARY(256) NOT NULL,\n  `until` DATETIME(6) NOT NULL,\n  `owner` CHAR(32) NOT NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_probe_names_the_row_in_hex_and_rolls_back() {
        let mysql = Sql::new("t", "t_fence", false, true, true);
        assert_eq!(
            mysql.row_probe("a/\u{1}"),
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
             SELECT 1 FROM `t` WHERE `name` = X'612F01' FOR SHARE NOWAIT; ROLLBACK"
        );
        let mariadb = Sql::new("t", "t_fence", true, true, true);
        assert!(mariadb
            .row_probe("x")
            .ends_with("`name` = X'78' LOCK IN SHARE MODE NOWAIT; ROLLBACK"));
    }

    #[test]
    fn probes_name_their_rows_in_hex_and_roll_back() {
        let mysql = Sql::new("t", "t_fence", false, true, true);
        let p = mysql.rows_probe(b"a", b"a\x01rw", &[&b"a\x01rw"[..]]);
        assert!(p.starts_with(PROBE_BEGIN), "{p}");
        assert!(p.contains("`name` >= X'61' AND `name` <= X'61017277' FOR SHARE SKIP LOCKED;"));
        assert!(p.contains("IN (X'61017277') FOR UPDATE SKIP LOCKED;"));
        assert!(p.ends_with(" ROLLBACK"));
        assert!(!mysql.rows_probe(b"a", b"b", &[]).contains("FOR UPDATE"));
        let mariadb = Sql::new("t", "t_fence", true, true, true);
        let p = mariadb.slots_probe(b"s\x01sem\x01", b"s\x01sem\x02");
        assert!(p.contains("`name` >= X'730173656D01' AND `name` < X'730173656D02' LOCK IN SHARE MODE SKIP LOCKED; ROLLBACK"));
        let p = mariadb.rw_probe(b"r\x01rw");
        assert_eq!(p.matches("X'72017277'").count(), 3);
        assert!(p.ends_with("FOR UPDATE SKIP LOCKED; ROLLBACK"));
        assert_eq!(mysql.list_rows.matches('?').count(), 3);
    }

    #[test]
    fn term_lock_and_inspect_take_the_parameters_bound() {
        for values in [true, false] {
            let sql = Sql::new("t", "t_fence", false, values, values);
            // The row and the term, twice.
            assert_eq!(sql.term_lock.matches('?').count(), 4);
            // The row's user lock and the fencing row's name; the term's
            // user lock is named from the fencing row's own columns.
            assert_eq!(sql.inspect.matches('?').count(), 2);
            assert!(sql.inspect.contains("CAST(`f`.`fence` AS BINARY)"));
        }
    }
}
