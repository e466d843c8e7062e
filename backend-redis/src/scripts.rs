//! The Lua scripts of the lock recipe and the keys a lock name maps to.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

/// How long a name's fencing counter outlives its last acquisition.
///
/// The counter only has to bridge the server clock's resolution: tokens are
/// `max(last + 1, server time in µs)`, so once the counter has expired the
/// clock alone still gives a larger token, unless the server's clock has
/// stepped back by more than the time since that last acquisition. The
/// counter keys on a server are thus bounded by the names used in the last
/// hour, not by every name ever used.
pub(crate) const FENCE_KEEP: Duration = Duration::from_secs(3600);

/// `SET lock token NX PX ttl`, and on success the next fencing token in the
/// same slot: `max(counter + 1, TIME in µs)`, stored back with a
/// [`FENCE_KEEP`] expiry. Returns `{1, fence}` or `{0, pttl of the holder}`.
///
/// For a lease that carries a value (an election's candidate), a third key
/// and a fourth argument, the value: on success it also sets
/// `value-key "<token> <fence> <value>" PX ttl`, so the value lives as long
/// as the lease and names its owner and token.
///
/// Microseconds since 1970 stay below 2^53 (exact in Lua's doubles) until
/// the year 2255.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, now)
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[1] .. ' ' .. string.format('%.0f', fence) .. ' ' .. ARGV[4], 'PX', ARGV[2])
  end
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}",
    )
});

/// [`ACQUIRE`] for several names at once, all or none (keys: each name's
/// lock key and fencing counter in turn; arguments: each name's owner
/// token and ttl in turn, then [`FENCE_KEEP`]): when every lock key is
/// free, sets them all and advances each counter, returning `{1, fence,
/// fence, ...}`; otherwise sets nothing and returns `{0, i}`, `i` the first
/// held name (1-based).
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
    return {0, i}
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {1}
for i = 1, n do
  redis.call('SET', KEYS[2 * i - 1], ARGV[2 * i - 1], 'PX', ARGV[2 * i])
  local fence = math.max((tonumber(redis.call('GET', KEYS[2 * i])) or 0) + 1, now)
  redis.call('SET', KEYS[2 * i], string.format('%.0f', fence), 'PX', ARGV[2 * n + 1])
  out[i + 1] = fence
end
return out",
    )
});

/// `PEXPIRE` only if the key still holds this owner's token. 1 or 0.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0",
    )
});

/// [`RENEW`] for a lease that carries a value (keys: lock, value, fence;
/// arguments: token, ttl, [`FENCE_KEEP`], the lease's token): the value key
/// gets the lock key's expiry, and the fencing counter is kept at least at
/// the lease's token for [`FENCE_KEEP`] more, so a leader that holds for
/// hours keeps its counter (left alone if another client put something
/// other than a string there: the renewal does not fail for it). 1 or 0.
pub(crate) static RENEW_WITH_VALUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  local r = redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  local v = redis.pcall('GET', KEYS[3])
  if type(v) ~= 'table' then
    local c = tonumber(v) or 0
    if c < tonumber(ARGV[4]) then
      redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[3])
    else
      redis.call('PEXPIRE', KEYS[3], ARGV[3])
    end
  end
  return r
end
return 0",
    )
});

/// Renewals of many keys in one call (keys: the lock keys; arguments: each
/// key's owner token and ttl in milliseconds, in turn). For each key: 1
/// when it held its owner's token and was renewed (`PEXPIRE`); 0 when
/// another owner holds it (or a value of another type is there); -1 when
/// there is no such key (it expired, an operator deleted it, or a RedLock
/// instance restarted without persistence). A key's owner or type never
/// fails the others' answers (a server error does: `READONLY`, or a ttl the
/// server refuses, which lockcore's 24 h bound on ttls keeps out).
pub(crate) static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local r = {}
for i, k in ipairs(KEYS) do
  local v = redis.pcall('GET', k)
  if v == ARGV[2 * i - 1] then
    r[i] = redis.call('PEXPIRE', k, ARGV[2 * i])
  elseif not v then
    r[i] = -1
  else
    r[i] = 0
  end
end
return r",
    )
});

/// Compare-and-delete, then a wake-up on the release channel. 1 or 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0",
    )
});

/// Holder token, its pttl, the last fencing token issued, and the value
/// key (`"<token> <fence> <value>"`, of the lease whose token it names).
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3])}",
    )
});

/// One instance's view of a RedLock key: its value (the holder's token) and
/// its pttl.
pub(crate) static HOLDER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(r"return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}")
});

/// The Redis keys of one lock name.
///
/// A name maps to `<prefix>{<name>}` (the lock key, holding the owner token
/// as a plain string with a PX expiry), `<prefix>{<name>}:fence` (the fencing
/// counter), `<prefix>{<name>}:value` (an election leader's value, written
/// only by a lease that carries one) and the pub/sub channel
/// `<prefix>{<name>}:released`. The braces are a hash tag: the keys live
/// in one cluster slot whatever the name.
///
/// A name that starts with `}` would give an empty hash tag (`{}`), which
/// Redis Cluster ignores, hashing each whole key to its own slot; such names
/// map to `<prefix>#{<name in hex>}` instead (and its `:fence`, `:value`,
/// `:released`). No other name maps there: every other key has `{` right
/// after the prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) value: String,
    pub(crate) channel: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = if name.starts_with('}') {
            let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
            format!("{prefix}#{{{hex}}}")
        } else {
            format!("{prefix}{{{name}}}")
        };
        Keys {
            fence: format!("{lock}:fence"),
            value: format!("{lock}:value"),
            channel: format!("{lock}:released"),
            lock,
        }
    }
}

/// The `SCAN` pattern of the lock keys of names starting with `prefix`
/// (glob characters escaped): `<key prefix>{<prefix>*`, or for a prefix
/// that starts with `}` (such names live under `<key prefix>#{<hex>}`, see
/// [`Keys`]) `<key prefix>#{<prefix in hex>*`, hex being byte by byte.
pub(crate) fn scan_pattern(key_prefix: &str, prefix: &str) -> String {
    let escape = |s: &str| {
        s.chars().fold(String::new(), |mut out, c| {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
            out
        })
    };
    if prefix.is_empty() {
        format!("{}*", escape(key_prefix))
    } else if prefix.starts_with('}') {
        let hex: String = prefix.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}#{{{hex}*", escape(key_prefix))
    } else {
        format!("{}{{{}*", escape(key_prefix), escape(prefix))
    }
}

/// The name whose lock key is `key` (see [`Keys`]), or `None` for another
/// key (a fencing counter, a value, another program's key).
pub(crate) fn name_of_key(key_prefix: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(key_prefix)?;
    if let Some(hex) = rest.strip_prefix("#{").and_then(|r| r.strip_suffix('}')) {
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        return String::from_utf8(bytes).ok();
    }
    let name = rest.strip_prefix('{')?.strip_suffix('}')?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// When a fencing token was granted, where it is the server's time in
/// microseconds (it is `max(counter + 1, TIME)`: the time, unless grants
/// came faster than the clock).
pub(crate) fn time_of_fence(fence: u64) -> Option<std::time::SystemTime> {
    // Tokens below 2001-09-09 in µs are counters, not times.
    (fence > 1_000_000_000_000_000).then(|| std::time::UNIX_EPOCH + Duration::from_micros(fence))
}

/// ttl in whole milliseconds, as a string argument.
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().to_string()
}
