//! Exit codes of `distlock` (from sysexits.h where one fits).

use distlock::{Error, ErrorKind};

/// Bad arguments, name or configuration (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// The backend's server is unavailable (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// Any other failure of distlock itself (EX_SOFTWARE).
pub(crate) const SOFTWARE: u8 = 70;
/// The server refused the credentials, or their absence (EX_NOPERM).
pub(crate) const UNAUTHORIZED: u8 = 77;
/// `run`: the lock could not be had within the wait; nothing was run (EX_TEMPFAIL).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// `run`: the lease was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// `run`: the command could not be started (as shells do).
pub(crate) const NOT_STARTED: u8 = 127;

/// The exit codes, for `--help` (the README has the same table, and a
/// test walks every line).
pub(crate) const HELP: &str = "\
Exit codes (every subcommand; `elect` as `run`, with leadership for the lock):
  cmd      run: the command's own exit status (128+N when a signal N killed it)
  0        done (leader --watch: ended by SIGINT, SIGTERM or SIGHUP, or its output was closed)
  64       usage: bad arguments, name or URL; memory:// given to run, elect or leader;
           elect or leader on a backend with no election
  69       the server is unavailable, or answered in another protocol
  70       any other error (a server's refusal of a request, an internal error)
  75       run: the lock could not be had within --wait (at once with --no-wait); nothing ran
  76       run: the lease was lost while the command ran; it got SIGTERM, then SIGKILL after
           --grace (at once when the lease's validity ran out)
  77       the server refused the credentials (a wrong or missing password, no rights)
  127      run: the command could not be started
  129-143  run: SIGHUP, SIGINT or SIGTERM came while waiting for the lock; nothing ran
(75 and 76 can be changed with --conflict-exit-code and --lost-exit-code.)";

/// The exit code for an error that ended a command.
pub(crate) fn for_error(e: &Error) -> u8 {
    match e.kind() {
        ErrorKind::InvalidName | ErrorKind::InvalidConfig => USAGE,
        ErrorKind::Unavailable => UNAVAILABLE,
        ErrorKind::Unauthorized => UNAUTHORIZED,
        ErrorKind::Timeout => NOT_ACQUIRED,
        ErrorKind::Lost => LOST,
        _ => SOFTWARE,
    }
}
