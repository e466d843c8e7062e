//! Clients for the configured servers: TLS, credentials, a cluster's connection.

use lockcore::{Error, Result};
use redis::cluster_async::ClusterConnection;

use crate::config::{Node, RedisConfig, NAME};
use crate::error::map_connect_err;

/// The root certificate of `cfg.ca_file`, read for TLS.
#[cfg(feature = "tls")]
fn tls_certs(cfg: &RedisConfig) -> Result<Option<redis::TlsCertificates>> {
    let Some(path) = &cfg.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| {
        Error::invalid_config(NAME, format!("ca_file {path:?} cannot be read: {e}")).with_source(e)
    })?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// A client for one node, over TLS when the settings ask for it.
pub(crate) fn client(node: &Node, cfg: &RedisConfig) -> Result<redis::Client> {
    let url = node.client_url(cfg.tls);
    let invalid = |e: redis::RedisError| {
        Error::invalid_config(NAME, format!("Redis address {node}: {e}")).with_source(e)
    };
    if !cfg.tls {
        return redis::Client::open(url).map_err(invalid);
    }
    #[cfg(feature = "tls")]
    {
        match tls_certs(cfg)? {
            Some(certs) => redis::Client::build_with_tls(url, certs).map_err(invalid),
            None => redis::Client::open(url).map_err(invalid),
        }
    }
    #[cfg(not(feature = "tls"))]
    {
        Err(Error::invalid_config(
            NAME,
            "TLS (rediss://) needs the `tls` feature of lockcore-redis (in distlock: the `full` feature)",
        ))
    }
}

/// Connects to a cluster by its seed nodes.
pub(crate) async fn connect_cluster(
    nodes: &[Node],
    cfg: &RedisConfig,
) -> Result<ClusterConnection> {
    let seeds: Vec<String> = nodes.iter().map(|n| n.client_url(cfg.tls)).collect();
    let shown = nodes
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let builder = redis::cluster::ClusterClient::builder(seeds)
        .connection_timeout(cfg.connect_timeout)
        .response_timeout(cfg.request_timeout())
        .retries(2);
    #[cfg(feature = "tls")]
    let builder = match tls_certs(cfg)? {
        Some(certs) if cfg.tls => builder.certs(certs),
        _ => builder,
    };
    #[cfg(not(feature = "tls"))]
    if cfg.tls {
        return Err(Error::invalid_config(
            NAME,
            "TLS (rediss+cluster://) needs the `tls` feature of lockcore-redis (in distlock: the `full` feature)",
        ));
    }
    let client = builder.build().map_err(|e| {
        Error::invalid_config(NAME, format!("Redis Cluster seeds {shown}: {e}")).with_source(e)
    })?;
    match tokio::time::timeout(cfg.connect_timeout * 3, client.get_async_connection()).await {
        Ok(r) => r.map_err(|e| map_connect_err(e, &shown)),
        Err(_) => Err(Error::unavailable(
            NAME,
            format!("connect to cluster {shown}: no answer"),
        )),
    }
}
