//! A TCP proxy between a client and its server, with faults per direction.
//!
//! Cases route a client's connections through [`Proxies`] (see
//! [`Harness::connect_via`](crate::Harness::connect_via)) and then delay,
//! blackhole or cut them while the real server runs on untouched, so the
//! other cases and clients see no fault.
//!
//! - [`Proxies::delay`]: every chunk read after the call is held this long
//!   before it is passed on (a slow network, a stalled server; a drop of the
//!   client's future lands inside a request).
//! - [`Proxies::blackhole`]: from now on the data in one or both directions
//!   is silently discarded on every open connection, which stays dead for
//!   good (the stream is broken, as after a silent network drop); new
//!   connections are accepted and dead too, until [`Proxies::heal`].
//! - [`Proxies::reset`]: every open connection is closed at once.
//! - [`Proxies::impostor`]: new connections are answered by something
//!   that speaks another protocol (an HTTP server, say) instead of the
//!   server.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

/// A direction of traffic through a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server (requests).
    Up,
    /// Server to client (replies).
    Down,
    /// Both.
    Both,
}

impl Dir {
    fn covers(self, i: usize) -> bool {
        match self {
            Dir::Up => i == 0,
            Dir::Down => i == 1,
            Dir::Both => true,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default, Clone, Copy)]
struct Cfg {
    delay: [Duration; 2],
    blackholed: [bool; 2],
    impostor: Option<&'static [u8]>,
}

#[derive(Debug)]
struct Conn {
    dead: [AtomicBool; 2],
    kill: Notify,
    killed: AtomicBool,
}

impl Conn {
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        self.kill.notify_waiters();
    }
}

#[derive(Debug, Default)]
struct State {
    cfg: Mutex<Cfg>,
    conns: Mutex<Vec<Weak<Conn>>>,
    /// When a chunk from the client was last read (before any delay).
    last_up: Mutex<Option<std::time::Instant>>,
}

impl State {
    fn live(&self) -> Vec<Arc<Conn>> {
        let mut conns = lock(&self.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.iter().filter_map(Weak::upgrade).collect()
    }
}

/// One proxy in front of one upstream address.
#[derive(Debug)]
struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.state.live() {
            c.kill();
        }
    }
}

impl Proxy {
    async fn start(upstream: String, cfg: Cfg) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            cfg: Mutex::new(cfg),
            ..State::default()
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, state.clone()));
        Ok(Proxy {
            addr,
            state,
            accept,
        })
    }
}

async fn accept_loop(listener: TcpListener, upstream: String, state: Arc<State>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if let Some(reply) = lock(&state.cfg).impostor {
            tokio::spawn(impostor(inbound, reply));
            continue;
        }
        let Ok(outbound) = TcpStream::connect(&upstream).await else {
            continue; // the client sees the connection close
        };
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let cfg = *lock(&state.cfg);
        let conn = Arc::new(Conn {
            dead: [
                AtomicBool::new(cfg.blackholed[0]),
                AtomicBool::new(cfg.blackholed[1]),
            ],
            kill: Notify::new(),
            killed: AtomicBool::new(false),
        });
        lock(&state.conns).push(Arc::downgrade(&conn));
        let (ir, iw) = inbound.into_split();
        let (or, ow) = outbound.into_split();
        tokio::spawn(pipe(ir, ow, 0, conn.clone(), state.clone()));
        tokio::spawn(pipe(or, iw, 1, conn, state.clone()));
    }
}

/// Answers a connection with `reply`, then reads and ignores the rest.
async fn impostor(mut inbound: TcpStream, reply: &'static [u8]) {
    let _ = inbound.write_all(reply).await;
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = inbound.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// Copies one direction of a connection, applying the faults of `dir`.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    dir: usize,
    conn: Arc<Conn>,
    state: Arc<State>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = {
        let conn = conn.clone();
        async move {
            while let Some((at, chunk)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                if conn.dead[dir].load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            let _ = to.shutdown().await;
        }
    };
    let reader = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if dir == 0 {
                *lock(&state.last_up) = Some(std::time::Instant::now());
            }
            if conn.dead[dir].load(Ordering::SeqCst) {
                continue;
            }
            let delay = lock(&state.cfg).delay[dir];
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
        drop(tx);
    };
    let killed = async {
        let notified = conn.kill.notified();
        if !conn.killed.load(Ordering::SeqCst) {
            notified.await;
        }
    };
    tokio::select! {
        () = async { tokio::join!(reader, writer); } => {}
        () = killed => {}
    }
    // A dead direction ends with the other one: wake it.
    conn.kill();
}

/// The proxies of one client, one per upstream address, faulted together.
#[derive(Debug, Clone, Default)]
pub struct Proxies {
    inner: Arc<Mutex<HashMap<String, Arc<Proxy>>>>,
    /// The faults set so far, for proxies started later.
    current: Arc<Mutex<Cfg>>,
}

impl Proxies {
    /// An empty set.
    pub fn new() -> Self {
        Proxies::default()
    }

    /// The `host:port` to connect to instead of `upstream` (`host:port`); the
    /// proxy is started on first use and lives as long as this set.
    pub async fn route(&self, upstream: &str) -> io::Result<String> {
        if let Some(p) = lock(&self.inner).get(upstream) {
            return Ok(p.addr.to_string());
        }
        let cfg = *lock(&self.current);
        let p = Arc::new(Proxy::start(upstream.to_owned(), cfg).await?);
        let addr = p.addr.to_string();
        lock(&self.inner).insert(upstream.to_owned(), p);
        Ok(addr)
    }

    /// `url` with each of its `host[:port]` (default `default_port`) replaced
    /// by its proxy: `scheme://[user@]h1:p1,h2:p2[/path][?query]`.
    pub async fn route_url(&self, url: &str, default_port: u16) -> io::Result<String> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {why}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        let parsed =
            lockcore::raw::address::ServerUrl::parse(&format!("x://{hosts}"), default_port)
                .map_err(|e| bad(&e))?;
        let mut routed = Vec::new();
        for h in &parsed.hosts {
            routed.push(self.route(&h.to_string()).await?);
        }
        Ok(format!("{scheme}://{userinfo}{}{tail}", routed.join(",")))
    }

    fn all(&self) -> Vec<Arc<Proxy>> {
        lock(&self.inner).values().cloned().collect()
    }

    /// Holds every chunk read from now on for `delay` in `dir` (zero: none).
    /// Every fault applies to proxies routed later too (a client connected
    /// after a blackhole meets a silent server).
    pub fn delay(&self, dir: Dir, delay: Duration) {
        {
            let mut cfg = lock(&self.current);
            for i in 0..2 {
                if dir.covers(i) {
                    cfg.delay[i] = delay;
                }
            }
        }
        for p in self.all() {
            let mut cfg = lock(&p.state.cfg);
            for i in 0..2 {
                if dir.covers(i) {
                    cfg.delay[i] = delay;
                }
            }
        }
    }

    /// Silently discards the data in `dir` on every open connection, for
    /// good, and on connections opened until [`heal`](Proxies::heal).
    pub fn blackhole(&self, dir: Dir) {
        {
            let mut cfg = lock(&self.current);
            for i in 0..2 {
                if dir.covers(i) {
                    cfg.blackholed[i] = true;
                }
            }
        }
        for p in self.all() {
            {
                let mut cfg = lock(&p.state.cfg);
                for i in 0..2 {
                    if dir.covers(i) {
                        cfg.blackholed[i] = true;
                    }
                }
            }
            for c in p.state.live() {
                for (i, d) in c.dead.iter().enumerate() {
                    if dir.covers(i) {
                        d.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
    }

    /// From now on, new connections are answered by an impostor that sends
    /// `reply` and ignores what the client says: a port that speaks another
    /// protocol. Until [`heal`](Proxies::heal).
    pub fn impostor(&self, reply: &'static [u8]) {
        lock(&self.current).impostor = Some(reply);
        for p in self.all() {
            lock(&p.state.cfg).impostor = Some(reply);
        }
    }

    /// New connections pass data again and delays end (connections that
    /// were blackholed stay dead).
    pub fn heal(&self) {
        *lock(&self.current) = Cfg::default();
        for p in self.all() {
            *lock(&p.state.cfg) = Cfg::default();
        }
    }

    /// Closes every open connection at once.
    pub fn reset(&self) {
        for p in self.all() {
            for c in p.state.live() {
                c.kill();
            }
        }
    }

    /// When the client's last request (the last chunk it sent) reached the
    /// proxies: a request answered before now was sent no later than this.
    pub fn last_sent(&self) -> Option<std::time::Instant> {
        self.all()
            .iter()
            .filter_map(|p| *lock(&p.state.last_up))
            .max()
    }

    /// Open connections through these proxies.
    pub fn connections(&self) -> usize {
        self.all()
            .iter()
            .map(|p| {
                p.state
                    .live()
                    .iter()
                    .filter(|c| !c.killed.load(Ordering::SeqCst))
                    .count()
            })
            .sum()
    }
}
