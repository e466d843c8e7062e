//! Lock names: validation, and a reversible encoding into one path segment.
//!
//! A name is UTF-8, 1 to [`MAX_NAME_BYTES`] bytes, with no NUL and no control
//! characters. Beyond that names are opaque: `a/b`, `../x`, `%`, spaces, emoji
//! and SQL quotes are ordinary names. Backends whose keyspace is a path
//! (ZooKeeper, etcd) map a name to one segment with [`encode_segment`], never
//! by pasting it in.
//!
//! **Parts.** A primitive built from locks (a semaphore's slots, a
//! read-write lock's writers' gate and reader slots) names them after its
//! own name, joined by [`PART_SEPARATOR`] (U+001F, a control character), so
//! no user name reaches them: a lock named `cfg/write` is not the gate of
//! the read-write lock `cfg`, whose gate is `cfg` U+001F `write`. The
//! separator is accepted only in the exact names of parts (see
//! [`is_part_name`]), so that a test or an operator can look at a part by
//! the name the primitive gives ([`RwLock::gate_name`](crate::primitives::rwlock::RwLock::gate_name),
//! [`Semaphore::slot_name`](crate::primitives::semaphore::Semaphore::slot_name)); a primitive's own
//! name may not contain it.

use std::borrow::Cow;

use crate::error::{Error, ErrorKind, Result};

/// The longest name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Joins a primitive's name and the name of one of the locks it is built
/// of (see [Parts](self#parts)).
pub const PART_SEPARATOR: char = '\u{1f}';

/// Whether `name` is the name of a part of a primitive: a name without
/// control characters, then [`PART_SEPARATOR`] and `write`,
/// `permit-NNNN`, or `read`, the separator and `permit-NNNN` (four
/// digits).
///
/// ```
/// use lockcore::name::is_part_name;
///
/// assert!(is_part_name("cfg\u{1f}write"));
/// assert!(is_part_name("cfg\u{1f}read\u{1f}permit-0003"));
/// assert!(!is_part_name("cfg/write"));
/// assert!(!is_part_name("cfg\u{1f}other"));
/// ```
pub fn is_part_name(name: &str) -> bool {
    let permit = |p: &str| {
        p.strip_prefix("permit-")
            .is_some_and(|d| d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut parts = name.split(PART_SEPARATOR);
    let base = parts.next().unwrap_or_default();
    if base.is_empty() || base.chars().any(char::is_control) {
        return false;
    }
    let rest: Vec<&str> = parts.collect();
    match rest.as_slice() {
        ["write"] => true,
        [p] => permit(p),
        ["read", p] => permit(p),
        _ => false,
    }
}

/// Checks the name of a primitive (a semaphore, read-write lock or
/// election): a valid lock name that is not a part's.
///
/// # Errors
///
/// [`ErrorKind::InvalidName`] as [`validate_name`], and for a name with the
/// parts' separator.
pub(crate) fn validate_primitive_name(backend: &'static str, name: &str) -> Result<()> {
    validate_name(backend, name)?;
    if name.contains(PART_SEPARATOR) {
        return Err(Error::new(
            ErrorKind::InvalidName,
            backend,
            "U+001F separates a primitive's name from the locks it is built of: a primitive's name must not contain it",
        )
        .or_name(name));
    }
    Ok(())
}

/// Checks a lock name; `backend` is named in the error.
///
/// ```
/// use lockcore::{validate_name, ErrorKind};
///
/// assert!(validate_name("memory", "jobs/nightly report 🦀").is_ok());
/// let err = validate_name("memory", "bad\nname").unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidName);
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidName`] saying what is wrong with the name.
pub fn validate_name(backend: &'static str, name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        Some("a lock name must not be empty".to_owned())
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!(
            "a lock name is at most {MAX_NAME_BYTES} bytes, this one has {}",
            name.len()
        ))
    } else {
        let part = name.contains(PART_SEPARATOR) && is_part_name(name);
        name.char_indices()
            .find(|(_, c)| c.is_control() && !(part && *c == PART_SEPARATOR))
            .map(|(i, c)| {
                format!(
                    "a lock name must not contain NUL or control characters (found U+{:04X} at byte {i})",
                    c as u32
                )
            })
    };
    match problem {
        None => Ok(()),
        Some(message) => {
            // The error shows the name with `{:?}`, which escapes it.
            let shown: String = name.chars().take(64).collect();
            Err(Error::new(ErrorKind::InvalidName, backend, message).with_name(shown))
        }
    }
}

/// Validates the name of a primitive made of several locks (`what`: "a
/// semaphore"), whose longest lock name is `name` followed by `suffix`.
pub(crate) fn validate_compound_name(
    backend: &'static str,
    name: &str,
    suffix: &str,
    what: &str,
) -> Result<()> {
    validate_primitive_name(backend, name)?;
    if name.len() + suffix.len() > MAX_NAME_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidName,
            backend,
            format!(
                "{what} name has at most {} bytes (its locks add {:?})",
                MAX_NAME_BYTES - suffix.len(),
                suffix
            ),
        )
        .or_name(name));
    }
    Ok(())
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~' | b'.')
}

/// Encodes a name into one path segment, reversibly.
///
/// ASCII letters, digits and `-_~.` stand as they are; every other byte is
/// `%XX` (uppercase hex). The segments `.` and `..` become `%2E` and
/// `%2E%2E`. The result never contains `/`, is never empty for a valid name,
/// and [`decode_segment`] gives the name back.
///
/// ```
/// use lockcore::name::{decode_segment, encode_segment};
///
/// assert_eq!(encode_segment("jobs/nightly"), "jobs%2Fnightly");
/// assert_eq!(encode_segment(".."), "%2E%2E");
/// assert_eq!(decode_segment(&encode_segment("ünï/cødé ..")).as_deref(), Some("ünï/cødé .."));
/// ```
pub fn encode_segment(name: &str) -> Cow<'_, str> {
    if name == "." || name == ".." {
        return Cow::Owned("%2E".repeat(name.len()));
    }
    if name.bytes().all(is_plain) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    Cow::Owned(out)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Reverses [`encode_segment`]; `None` when `segment` is not its output.
pub fn decode_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = segment.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if is_plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_odd_but_valid_names() {
        for n in [
            "a",
            "a/b",
            "../x",
            "%",
            "with space",
            "🦀",
            "'; DROP TABLE x; --",
            ".",
        ] {
            assert!(validate_name("t", n).is_ok(), "{n:?}");
        }
        assert!(validate_name("t", &"x".repeat(MAX_NAME_BYTES)).is_ok());
    }

    #[test]
    fn refuses_invalid_names() {
        for n in [
            String::new(),
            "x".repeat(MAX_NAME_BYTES + 1),
            "a\0b".into(),
            "tab\t".into(),
            "\u{7f}".into(),
            "\u{85}".into(),
        ] {
            let e = validate_name("t", &n).expect_err("must be refused");
            assert_eq!(e.kind(), ErrorKind::InvalidName, "{n:?}");
        }
    }

    #[test]
    fn segment_roundtrip() {
        for n in [
            "a", "a/b", ".", "..", "...", "%41", "ü", "🦀/..", "a b", "A-_~.z",
        ] {
            let enc = encode_segment(n);
            assert!(!enc.contains('/') && enc != "." && enc != "..", "{enc}");
            assert_eq!(decode_segment(&enc).as_deref(), Some(n));
        }
        assert_eq!(decode_segment("%zz"), None);
        assert_eq!(decode_segment("a/b"), None);
    }

    #[test]
    fn distinct_names_distinct_segments() {
        assert_ne!(encode_segment("a/b"), encode_segment("a%2Fb"));
    }
}
