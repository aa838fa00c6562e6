//! The few etcd v3 calls a directory's election needs, through etcd's JSON gateway
//! (`POST /v3/...` over HTTP/1.1, keys and values in base64): grant and keep alive a lease,
//! put the leader key under it only if the key does not exist (a transaction), read the
//! key, revoke the lease. One short-lived TCP connection per call, each within
//! [`ETCD_CALL_TIMEOUT`], to the first endpoint of the list that answers; responses are
//! bounded ([`ETCD_RESPONSE_BYTES_MAX`]). No gRPC stack: the election makes a few calls a
//! second.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one call to one endpoint may take, connecting included.
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest response read: the election's responses are a few hundred bytes.
pub const ETCD_RESPONSE_BYTES_MAX: usize = 64 << 10;

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered within [`ETCD_CALL_TIMEOUT`] (or none is configured).
    #[error("no etcd endpoint answered: {last}")]
    Unreachable {
        /// What the last endpoint tried did.
        last: String,
    },
    /// An endpoint answered something that is not the expected response.
    #[error("etcd answered {status}: {body}")]
    Refused {
        /// The HTTP status line's code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The response could not be read as the call's JSON.
    #[error("unreadable etcd response: {0}")]
    Malformed(String),
}

/// An etcd lease's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdLease(pub i64);

/// What a campaign found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The key was absent and now holds our value under our lease: we lead, in `term` (the
    /// key's creation revision, larger than every earlier leader's).
    Won {
        /// The leadership's term.
        term: u64,
    },
    /// Another holder has the key.
    Held {
        /// The holder's value.
        holder: String,
    },
}

/// A client of an etcd cluster's JSON gateway.
#[derive(Clone, Debug)]
pub struct EtcdClient {
    endpoints: Vec<SocketAddr>,
}

impl EtcdClient {
    /// A client of the cluster whose members' client URLs are `endpoints` (plain HTTP on a
    /// trusted network: the election key holds only an address).
    pub fn new(endpoints: Vec<SocketAddr>) -> EtcdClient {
        EtcdClient { endpoints }
    }

    /// Grants a lease of `ttl` (whole seconds, at least one): the lease and the time to
    /// live etcd gave it, which is longer than asked when `ttl` is under etcd's minimum
    /// (1.5 × its election timeout, rounded up to whole seconds).
    pub async fn grant(&self, ttl: Duration) -> Result<(EtcdLease, Duration), EtcdError> {
        let seconds = ttl.as_secs().max(1);
        let reply = self
            .call("/v3/lease/grant", json!({ "TTL": seconds }))
            .await?;
        let lease = integer(&reply["ID"])
            .map(EtcdLease)
            .ok_or_else(|| EtcdError::Malformed(format!("no lease id in {reply}")))?;
        let granted = integer(&reply["TTL"])
            .filter(|granted| *granted > 0)
            .map_or(seconds, |granted| granted as u64);
        Ok((lease, Duration::from_secs(granted)))
    }

    /// Renews `lease`: its time to live from now, or `None` when the lease is gone.
    pub async fn keep_alive(&self, lease: EtcdLease) -> Result<Option<Duration>, EtcdError> {
        let reply = self
            .call("/v3/lease/keepalive", json!({ "ID": lease.0.to_string() }))
            .await?;
        let ttl = integer(&reply["result"]["TTL"]).unwrap_or(0);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    /// Revokes `lease`: keys under it are deleted at once (a leader stepping down).
    pub async fn revoke(&self, lease: EtcdLease) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.0.to_string() }))
            .await
            .map(drop)
    }

    /// Puts `value` at `key` under `lease` if `key` does not exist; else reads its holder.
    pub async fn campaign(
        &self,
        key: &str,
        value: &str,
        lease: EtcdLease,
    ) -> Result<Campaign, EtcdError> {
        let key = BASE64.encode(key);
        let request = json!({
            "compare": [{ "key": key, "target": "CREATE", "create_revision": "0" }],
            "success": [{ "request_put": {
                "key": key, "value": BASE64.encode(value), "lease": lease.0.to_string()
            } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let reply = self.call("/v3/kv/txn", request).await?;
        if reply["succeeded"].as_bool() == Some(true) {
            let term = integer(&reply["header"]["revision"])
                .ok_or_else(|| EtcdError::Malformed(format!("no revision in {reply}")))?;
            return Ok(Campaign::Won { term: term as u64 });
        }
        let holder = reply["responses"][0]["response_range"]["kvs"][0]["value"].clone();
        Ok(Campaign::Held {
            holder: decode_text(&holder).unwrap_or_default(),
        })
    }

    /// The value at `key` and its creation revision, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<(String, u64)>, EtcdError> {
        let reply = self
            .call("/v3/kv/range", json!({ "key": BASE64.encode(key) }))
            .await?;
        let kv = &reply["kvs"][0];
        if kv.is_null() {
            return Ok(None);
        }
        let value = decode_text(&kv["value"]).unwrap_or_default();
        let revision = integer(&kv["create_revision"]).unwrap_or(0) as u64;
        Ok(Some((value, revision)))
    }

    /// Posts `body` to `path` on each endpoint in turn until one answers.
    async fn call(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        let mut last = "no endpoint configured".to_string();
        for endpoint in &self.endpoints {
            let attempt = tokio::time::timeout(ETCD_CALL_TIMEOUT, post(*endpoint, path, &body));
            match attempt.await {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(EtcdError::Unreachable { last: reason })) => {
                    last = format!("{endpoint}: {reason}")
                }
                Ok(Err(error)) => return Err(error),
                Err(_) => last = format!("{endpoint}: no answer within {ETCD_CALL_TIMEOUT:?}"),
            }
        }
        Err(EtcdError::Unreachable { last })
    }
}

/// A JSON integer that etcd's gateway writes as a string (64-bit values) or a number.
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_i64(),
        _ => None,
    }
}

fn decode_text(value: &Value) -> Option<String> {
    let bytes = BASE64.decode(value.as_str()?).ok()?;
    String::from_utf8(bytes).ok()
}

/// One HTTP/1.1 POST with `Connection: close`; the body read to the end of the stream
/// (de-chunked when the response is chunked).
async fn post(endpoint: SocketAddr, path: &str, body: &Value) -> Result<Value, EtcdError> {
    let unreachable = |error: std::io::Error| EtcdError::Unreachable {
        last: error.to_string(),
    };
    let mut stream = TcpStream::connect(endpoint).await.map_err(unreachable)?;
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(unreachable)?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await.map_err(unreachable)?;
        if read == 0 {
            break;
        }
        if response.len() + read > ETCD_RESPONSE_BYTES_MAX {
            return Err(EtcdError::Malformed(format!(
                "response over {ETCD_RESPONSE_BYTES_MAX} bytes"
            )));
        }
        response.extend_from_slice(&chunk[..read]);
    }
    parse_response(&response)
}

/// The JSON body of an HTTP/1.1 response (status 200 only).
fn parse_response(response: &[u8]) -> Result<Value, EtcdError> {
    let text = String::from_utf8_lossy(response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(EtcdError::Malformed("no end of headers".into()));
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| EtcdError::Malformed(format!("no status in `{head}`")))?;
    let chunked = head.lines().any(|line| {
        line.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    if status != 200 {
        return Err(EtcdError::Refused {
            status,
            body: body.chars().take(200).collect(),
        });
    }
    serde_json::from_str(body.trim()).map_err(|error| EtcdError::Malformed(error.to_string()))
}

fn dechunk(mut body: &str) -> Result<String, EtcdError> {
    let mut out = String::new();
    loop {
        let Some((size, rest)) = body.split_once("\r\n") else {
            return Ok(out);
        };
        let size = usize::from_str_radix(size.trim(), 16)
            .map_err(|_| EtcdError::Malformed(format!("bad chunk size `{size}`")))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| EtcdError::Malformed("chunk cut short".into()))?;
        out.push_str(chunk);
        body = rest.get(size..).unwrap_or("").trim_start_matches("\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_plain_and_chunked_and_refusals_are_typed() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ID\":\"42\"}";
        assert_eq!(integer(&parse_response(plain).unwrap()["ID"]), Some(42));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n{\"a\":1\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap()["a"], 1);
        let refused = b"HTTP/1.1 400 Bad Request\r\n\r\nbad";
        assert!(matches!(
            parse_response(refused),
            Err(EtcdError::Refused { status: 400, .. })
        ));
        for malformed in [
            &b"garbage"[..],
            b"HTTP/1.1 200 OK\r\n\r\nnot json",
            b"\r\n\r\n",
        ] {
            assert!(matches!(
                parse_response(malformed),
                Err(EtcdError::Malformed(_))
            ));
        }
        assert!(dechunk("zz\r\nab").is_err());
        assert!(dechunk("5\r\nab").is_err());
    }
}
