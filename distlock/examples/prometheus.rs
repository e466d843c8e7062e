//! Lock metrics for Prometheus: the `metrics` feature emits through the
//! `metrics` facade, and `metrics-exporter-prometheus` renders them. A few
//! workers contend for one name (some waits time out, one lease is let
//! lapse) while `/metrics` is served on 127.0.0.1:9898 (`METRICS_ADDR`);
//! after `RUN_SECS` (5) the page is printed and the example ends.
//!
//! Run: `cargo run -p distlock --features metrics --example prometheus`
//! (any backend: `DISTLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock --features metrics,redis --example prometheus`)

use std::time::Duration;

use distlock::{LockOptions, Wait};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers every request on `listener` with the rendered metrics.
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    while let Ok((mut conn, _)) = listener.accept().await {
        let body = handle.render();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let listener = TcpListener::bind(&addr).await?;
    eprintln!("serving http://{addr}/metrics");
    tokio::spawn(serve(listener, handle.clone()));

    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "memory://".into());
    let locker = distlock::connect(&url).await?;
    let run_for = std::env::var("RUN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let until = tokio::time::Instant::now() + Duration::from_secs(run_for);

    let mut workers = Vec::new();
    for _ in 0..4 {
        let locker = locker.clone();
        workers.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < until {
                // Waits of 150 ms for work of 100 ms among four workers:
                // some time out.
                match locker
                    .lock_timeout("reports/nightly", Duration::from_millis(150))
                    .await
                {
                    Ok(g) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = g.release().await;
                    }
                    Err(e) => eprintln!("{e}"),
                }
            }
        }));
    }
    // One lease let lapse: a lost lease, by reason.
    let lapsing = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .renew(false)
        .wait(Wait::Forever);
    if let Some(g) = locker.acquire("reports/lapsing", &lapsing).await? {
        g.lost().await;
    }
    for w in workers {
        w.await?;
    }
    println!("{}", handle.render());
    Ok(())
}
