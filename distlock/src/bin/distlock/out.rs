//! Writing a command's output to stdout: a reader that went away (`| head
//! -c1`, `| true`) ends the command quietly, never a panic.

use crate::exit;

/// How writing a line went.
pub(crate) enum Said {
    /// Written.
    Yes,
    /// Stdout is closed (a reader like `head -1` went away): `--watch`
    /// ends quietly.
    Closed,
    /// Another write error: the exit code, after a message.
    Failed(u8),
}

/// Writes one line to stdout.
pub(crate) fn say(text: &str) -> Said {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Said::Yes,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Said::Closed,
        Err(e) => {
            warn_line!("distlock: writing to stdout: {e}");
            Said::Failed(exit::SOFTWARE)
        }
    }
}

/// Prints `text` (a command's whole output) and a newline; the exit code:
/// 0 when written or when the reader had gone, otherwise the failure's.
pub(crate) fn print(text: &str) -> u8 {
    match say(text) {
        Said::Yes | Said::Closed => 0,
        Said::Failed(code) => code,
    }
}

/// Writes a line to stderr; a stderr that is closed or full loses the
/// line, never ends the command (unlike `eprintln!`, which panics).
macro_rules! warn_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use warn_line;

/// Reports an error on stderr as one line (`distlock: ...`), whatever line
/// breaks a server's reply put into it.
pub(crate) fn fail(e: &dyn std::fmt::Display) {
    let text = e.to_string();
    warn_line!(
        "distlock: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}
