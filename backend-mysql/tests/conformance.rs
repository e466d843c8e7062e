//! The conformance suite against MariaDB (or MySQL 8) from compose/, with
//! fencing (the default) and without (`fencing=none`).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use lockcore_conformance::run;

fn main() -> std::process::ExitCode {
    run(vec![
        harness::target("mysql"),
        harness::target_with("mysql-nofence", "fencing=none"),
    ])
}
