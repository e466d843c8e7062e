//! The statements, built once per backend (table names are checked
//! identifiers, quoted; lock names are always bound parameters), and the
//! schema.

use std::sync::Arc;

use lockcore::{Error, Result};

use crate::config::{check_table, NAME};

/// Every lock connection's session: no gap locks on a missing row, and no
/// shared locks for the existence check of a new name.
pub(crate) const SESSION_SETUP: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

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
    /// make a temporary table of it each time).
    pub(crate) publish: Arc<str>,
    /// Who holds a lock: its fencing row, value row, and the connection
    /// holding its user lock (`IS_USED_LOCK`).
    pub(crate) inspect: Arc<str>,
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
    pub(crate) fn new(table: &str, fence: &str, mariadb: bool, values: bool) -> Self {
        let value = value_table(table);
        let user_lock = user_lock_name(table);
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
                "INSERT INTO `{fence}` (`name`, `fence`, `holder_conn`, `owner`) VALUES (?, LAST_INSERT_ID(1), ?, ?) \
                 ON DUPLICATE KEY UPDATE `fence` = LAST_INSERT_ID(`fence` + 1), `holder_conn` = VALUES(`holder_conn`), `owner` = VALUES(`owner`)"
            )
            .into(),
            holder: format!("SELECT `holder_conn` FROM `{fence}` WHERE `name` = ?").into(),
            value: format!(
                "INSERT INTO `{value}` (`name`, `fence`, `value`) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE `value` = IF(VALUES(`fence`) > `fence`, VALUES(`value`), `value`), \
                 `fence` = GREATEST(`fence`, VALUES(`fence`))"
            )
            .into(),
            publish: format!(
                "SELECT CAST(GET_LOCK({user_lock}, ?) AS SIGNED), {user_lock}"
            )
            .into(),
            inspect: if values {
                format!(
                    "SELECT `f`.`fence`, `f`.`owner`, `f`.`holder_conn`, CAST(IS_USED_LOCK({user_lock}) AS UNSIGNED), `v`.`value`, `v`.`fence` \
                     FROM `{fence}` AS `f` LEFT JOIN `{value}` AS `v` ON `v`.`name` = `f`.`name` WHERE `f`.`name` = ?"
                )
            } else {
                format!(
                    "SELECT `f`.`fence`, `f`.`owner`, `f`.`holder_conn`, CAST(IS_USED_LOCK({user_lock}) AS UNSIGNED), NULL, NULL \
                     FROM `{fence}` AS `f` WHERE `f`.`name` = ?"
                )
            }
            .into(),
        }
    }
}

/// The table of the values candidates campaign with, beside lock table
/// `table`.
pub(crate) fn value_table(table: &str) -> String {
    format!("{table}_value")
}

/// The `CREATE TABLE` statements of the lock table `table`, its fencing
/// counter table `<table>_fence` and the table of leaders' values
/// `<table>_value`, for migrations.
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
/// ```
///
/// # Errors
///
/// [`lockcore::ErrorKind::InvalidConfig`] for a table name that is not a
/// plain identifier.
pub fn schema_sql(table: &str) -> Result<[String; 3]> {
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
    ])
}
