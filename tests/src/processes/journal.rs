//! Each worker's journal of leases, written as they are granted and end,
//! and read back after the soak.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use super::clock::Clock;

pub(crate) struct Journal {
    pub(crate) leases: Vec<(String, Option<u64>, u64, Option<u64>)>,
    pub(crate) lost: usize,
    pub(crate) errors: u64,
    pub(crate) samples: Vec<String>,
}

/// Reads a worker's journal: `A id name fence ns`, `E id ns how`, `X errors`.
/// Leases still open in a killed worker end when it was killed.
pub(crate) fn read_journal(path: &Path, killed: Option<u64>) -> Journal {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut j = Journal {
        leases: Vec::new(),
        lost: 0,
        errors: 0,
        samples: Vec::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["A", id, name, fence, ns] => {
                let (Ok(id), Ok(ns)) = (id.parse(), ns.parse()) else {
                    continue;
                };
                open.insert(id, j.leases.len());
                j.leases
                    .push(((*name).to_owned(), fence.parse().ok(), ns, None));
            }
            ["E", id, ns, how] => {
                let (Ok(id), Ok(ns)) = (id.parse::<u64>(), ns.parse()) else {
                    continue;
                };
                if let Some(i) = open.remove(&id) {
                    j.leases[i].3 = Some(ns);
                }
                if how.starts_with("lost") {
                    j.lost += 1;
                }
            }
            ["X", n] => j.errors = n.parse().unwrap_or(0),
            ["R", kind, msg] => j.samples.push(format!("{kind}: {msg}")),
            _ => {}
        }
    }
    for (_, i) in open {
        // A lease still open: its worker died (then it ended at the kill)
        // or never ended it, which the check reports as an overlap.
        j.leases[i].3 = killed;
    }
    j
}

pub(crate) struct JournalFile {
    pub(crate) file: Mutex<std::fs::File>,
    pub(crate) clock: Clock,
    pub(crate) next: AtomicU64,
}

impl JournalFile {
    pub(crate) fn line(&self, s: &str) {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = f.write_all(s.as_bytes());
    }
}
