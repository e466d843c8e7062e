//! Fault injection: a session expired on the server from a second handle
//! on it, as ZooKeeper's own tests do.

use lockcore::{Error, Result};
use zookeeper_client as zk;

use crate::config::{ZkConfig, NAME};
use crate::error::map_err;
use crate::session::Session;

/// How often [`Session::expire_on_server`] sends a closing twin before it
/// gives up: the session's own handle may take the session back each time.
const EXPIRE_TRIES: usize = 8;

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
        // gets through or the session is seen to have ended.
        let mut last = None;
        for _ in 0..EXPIRE_TRIES {
            if self.is_dead() {
                return Ok(());
            }
            let mut connector = zk::Client::connector()
                .with_session(info.clone())
                .with_session_timeout(self.timeout);
            if let Some((user, pass)) = &cfg.digest {
                connector =
                    connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
            }
            match tokio::time::timeout(cfg.connect_timeout, connector.connect(&hosts)).await {
                // Not detached: dropping it sends closeSession. The close
                // ends the session unless our handle took it back first:
                // wait until our handle sees the end, else try again.
                Ok(Ok(twin)) => {
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
                Ok(Err(e)) => {
                    last = Some(map_err(
                        e,
                        format!("reopening session {:#x} on {hosts}", self.id),
                        false,
                    ))
                }
                Err(_) => {
                    last = Some(Error::unavailable(
                        NAME,
                        format!("reopening session {:#x} on {hosts}: no answer", self.id),
                    ))
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::unavailable(NAME, format!("reopening session {:#x}", self.id))
        }))
    }
}
