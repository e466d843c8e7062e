//! Fault injection: a session expired on the server from a second handle
//! on it, as ZooKeeper's own tests do.

use std::time::Duration;

use lockcore::{Error, Result};
use zookeeper_client as zk;

use crate::config::{ZkConfig, NAME};
use crate::error::map_err;
use crate::session::Session;

/// How long [`Session::expire_on_server`] goes on sending closing twins
/// before it gives up: the session's own handle may take the session back
/// each time, and a twin that lost the session fails at once.
const EXPIRE_FOR: Duration = Duration::from_secs(60);

/// The pause between two twins, so that a lost race is not run again at
/// once in the same order.
const TWIN_PAUSE: Duration = Duration::from_millis(20);

impl Session {
    /// Closes the session on the server from a second handle on the same
    /// session id and password, as ZooKeeper's own tests expire a session
    /// (`KillServerSession`): this handle then sees its session expire.
    /// Returns once this handle has seen its session end.
    pub(crate) async fn expire_on_server(&self, cfg: &ZkConfig) -> Result<()> {
        if self.is_dead() {
            return Ok(());
        }
        let info = self.client()?.session().clone();
        let hosts = cfg.connect_string();
        // The session's own handle reconnects as soon as the server hands
        // the session to the twin, and may take it back before the twin's
        // handshake is answered: try again, a few times, until one twin
        // gets through or the session is seen to have ended. A twin fails
        // eagerly: one that keeps reconnecting races our handle for the
        // session until its connect timeout, and on a loaded machine loses
        // every time.
        let mut last = None;
        // What each twin met, for the error should none get through.
        let mut tally = Tally::default();
        let until = tokio::time::Instant::now() + EXPIRE_FOR;
        while tokio::time::Instant::now() < until {
            if self.is_dead() {
                return Ok(());
            }
            let mut connector = zk::Client::connector()
                .with_session(info.clone())
                .with_session_timeout(self.timeout)
                .with_fail_eagerly();
            if let Some((user, pass)) = &cfg.digest {
                connector =
                    connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
            }
            match tokio::time::timeout(cfg.connect_timeout, connector.connect(&hosts)).await {
                // Not detached: dropping it sends closeSession. The close
                // ends the session unless our handle took it back first:
                // wait until our handle sees the end, else try again.
                Ok(Ok(twin)) => {
                    tally.closed += 1;
                    drop(twin);
                    let seen =
                        tokio::time::timeout(cfg.connect_timeout + self.timeout, self.dead());
                    if seen.await.is_ok() {
                        return Ok(());
                    }
                    last = Some(Error::unavailable(
                        NAME,
                        format!("session {:#x} outlived its closing twin", self.id),
                    ));
                }
                Ok(Err(zk::Error::SessionExpired)) => return Ok(()),
                // The session's own handle took it back during the twin's
                // handshake: another twin.
                Ok(Err(e @ (zk::Error::NoHosts | zk::Error::ConnectionLoss))) => {
                    tally.refused += 1;
                    last = Some(map_err(
                        e,
                        format!("reopening session {:#x} on {hosts}", self.id),
                        false,
                    ));
                    tokio::time::sleep(TWIN_PAUSE).await;
                }
                Ok(Err(e)) => {
                    return Err(map_err(
                        e,
                        format!("reopening session {:#x} on {hosts}", self.id),
                        false,
                    ))
                }
                Err(_) => {
                    tally.unanswered += 1;
                    last = Some(Error::unavailable(
                        NAME,
                        format!("reopening session {:#x} on {hosts}: no answer", self.id),
                    ))
                }
            }
        }
        let last = last.unwrap_or_else(|| {
            Error::unavailable(NAME, format!("reopening session {:#x}", self.id))
        });
        // This handle's state says which way the race went: connected (it
        // took the session back each time) or not (nobody kept it).
        let state = self.client().map(|c| format!("{:?}", c.state()));
        Err(Error::new(
            last.kind(),
            NAME,
            format!(
                "{} ({}; this handle {})",
                last.message(),
                tally,
                state.unwrap_or_else(|e| format!("gone: {e}"))
            ),
        ))
    }
}

/// How the closing twins of one [`Session::expire_on_server`] fared.
#[derive(Debug, Default)]
struct Tally {
    /// Connected, then dropped (which sends `CloseSession`).
    closed: u32,
    /// Refused during the handshake (the session's own handle took it back).
    refused: u32,
    /// No answer within the connect timeout.
    unanswered: u32,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "twins: {} connected and closed, {} refused, {} unanswered",
            self.closed, self.refused, self.unanswered
        )
    }
}
