//! What the Redis benches share.

/// The `redis://host:port` of each master a lockcore Redis URL names.
pub(crate) fn masters(url: &str) -> Vec<String> {
    lockcore::raw::address::ServerUrl::parse(url, 6379)
        .expect("a redis URL")
        .hosts
        .iter()
        .map(|h| format!("redis://{h}"))
        .collect()
}
