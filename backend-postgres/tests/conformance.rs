//! The conformance suite against PostgreSQL from compose/.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use lockcore_conformance::run;

fn main() -> std::process::ExitCode {
    run(vec![harness::target("postgres")])
}
