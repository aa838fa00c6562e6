//! The minimal HTTP exporter: serves the registry's text at `GET /metrics`, bounded in
//! connections, request size and time.

use super::Metrics;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Largest request head (request line plus headers) the exporter reads. A scraper sends a
/// few hundred bytes; 8 KiB is the common web-server default and bounds each connection's
/// buffer. A longer head gets `431` and the connection is closed.
pub const REQUEST_HEADER_BYTES_MAX: usize = 8 * 1024;

/// Connections the exporter serves at once. Scrapers are one or two Prometheus servers and
/// the odd `curl`; 16 leaves room for those while bounding the tasks and buffers a flood of
/// connections can hold. Beyond it, connections wait in the listen backlog.
pub const EXPORTER_CONNECTIONS_MAX: usize = 16;

/// Longest a connection may take to send its request and receive the response. Bounds how
/// long a stalled or malicious client keeps one of [`EXPORTER_CONNECTIONS_MAX`] slots; a
/// render takes milliseconds, so 10 s is generous for any live scraper.
pub const CONNECTION_DURATION_MAX: Duration = Duration::from_secs(10);

/// Pause after a failed `accept` (typically `EMFILE`), so the exporter neither spins nor
/// exits while the condition lasts.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `GET /metrics` on `listener` until the returned future is dropped (which also
/// ends every open connection). One request per connection (`Connection: close`); any other
/// method or path gets `404`, a head over [`REQUEST_HEADER_BYTES_MAX`] gets `431`. At most
/// [`EXPORTER_CONNECTIONS_MAX`] connections are served at once, each for at most
/// [`CONNECTION_DURATION_MAX`]. Accept errors are logged and retried, never fatal.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    serve_from(listener, metrics, CONNECTION_DURATION_MAX).await
}

/// Where the exporter takes its connections from: a TCP listener, or an in-memory queue
/// in the tests.
trait Acceptor {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection, waiting for one.
    fn next_connection(&mut self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;

    async fn next_connection(&mut self) -> std::io::Result<TcpStream> {
        self.accept().await.map(|(stream, _peer)| stream)
    }
}

/// [`serve`] over any [`Acceptor`], each connection served for at most
/// `connection_duration_max`. Connections past the bound stay with the acceptor (a TCP
/// listener's backlog) until a served one ends.
async fn serve_from<A: Acceptor>(
    mut acceptor: A,
    metrics: Arc<Metrics>,
    connection_duration_max: Duration,
) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        if connections.len() >= EXPORTER_CONNECTIONS_MAX {
            connections.join_next().await;
            continue;
        }
        match acceptor.next_connection().await {
            Ok(stream) => {
                let metrics = Arc::clone(&metrics);
                connections.spawn(async move {
                    let served = tokio::time::timeout(
                        connection_duration_max,
                        serve_connection(stream, &metrics),
                    );
                    if let Ok(Err(error)) = served.await {
                        tracing::debug!(%error, "metrics connection failed");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "metrics exporter accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// Reads one request head, answers it, closes.
async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let Some(head) = read_request_head(&mut stream).await? else {
        return Ok(());
    };
    let response = match head {
        RequestHead::Complete(bytes) if is_metrics_request(&bytes) => {
            response("200 OK", prometheus::TEXT_FORMAT, &metrics.render())
        }
        RequestHead::Complete(_) => response("404 Not Found", "text/plain", "not found\n"),
        RequestHead::TooLarge => response(
            "431 Request Header Fields Too Large",
            "text/plain",
            "request header too large\n",
        ),
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// What arrived before the blank line that ends a request head.
enum RequestHead {
    /// The head, up to and excluding the blank line.
    Complete(Vec<u8>),
    /// More than [`REQUEST_HEADER_BYTES_MAX`] bytes without a blank line.
    TooLarge,
}

/// Reads until `\r\n\r\n` (included in the bound, excluded from the head); `None` if the
/// peer closed first. Reads at most one chunk past the bound.
async fn read_request_head<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> std::io::Result<Option<RequestHead>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let read_bytes = stream.read(&mut chunk).await?;
        if read_bytes == 0 {
            return Ok(None);
        }
        // Resume the search three bytes back, in case the terminator straddles chunks.
        let search_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..read_bytes]);
        let end = find(&head[search_from..], b"\r\n\r\n").map(|at| search_from + at);
        match end {
            Some(end) if end + 4 <= REQUEST_HEADER_BYTES_MAX => {
                head.truncate(end);
                return Ok(Some(RequestHead::Complete(head)));
            }
            Some(_) => return Ok(Some(RequestHead::TooLarge)),
            None if head.len() >= REQUEST_HEADER_BYTES_MAX => {
                return Ok(Some(RequestHead::TooLarge))
            }
            None => {}
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// `GET /metrics` (with or without a query string) in the request line.
fn is_metrics_request(head: &[u8]) -> bool {
    let request_line = head.split(|byte| *byte == b'\n').next().unwrap_or_default();
    let mut parts = request_line.split(|byte| *byte == b' ');
    let method = parts.next();
    let path = parts
        .next()
        .and_then(|target| target.split(|byte| *byte == b'?').next());
    method == Some(b"GET".as_slice()) && path == Some(b"/metrics".as_slice())
}

fn response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::{populated, FAMILIES};

    async fn exchange(address: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.unwrap();
        String::from_utf8(reply).unwrap()
    }

    #[tokio::test]
    async fn exporter_serves_metrics_and_refuses_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(populated())));

        let reply = exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.contains("Content-Type: text/plain; version=0.0.4\r\n"));
        for line in FAMILIES {
            assert!(reply.contains(line), "missing {line}");
        }
        let reply = exchange(address, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"));

        for request in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"POST /metrics HTTP/1.1\r\n\r\n",
            b"\r\n\r\n",
        ] {
            let reply = exchange(address, request).await;
            assert!(reply.starts_with("HTTP/1.1 404 Not Found\r\n"), "{reply}");
        }
        let mut oversized = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        oversized.resize(REQUEST_HEADER_BYTES_MAX + 100, b'a');
        oversized.extend_from_slice(b"\r\n\r\n");
        let reply = exchange(address, &oversized).await;
        assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");
        server.abort();
    }

    /// Connections handed to the exporter from memory, counting those it took.
    struct Queue {
        streams: tokio::sync::mpsc::UnboundedReceiver<tokio::io::DuplexStream>,
        taken: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Acceptor for Queue {
        type Stream = tokio::io::DuplexStream;

        async fn next_connection(&mut self) -> std::io::Result<tokio::io::DuplexStream> {
            match self.streams.recv().await {
                Some(stream) => {
                    self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(stream)
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Lets every task of this single-threaded runtime run until it waits on something
    /// only the test provides. Every input of the exporter here is in memory and wakes its
    /// task at once, so a fixed number of turns reaches the same state on every machine,
    /// however slow: no clock is involved.
    async fn settle() {
        for _ in 0..64 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn exporter_bounds_concurrent_connections() {
        let (sender, streams) = tokio::sync::mpsc::unbounded_channel();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let queue = Queue {
            streams,
            taken: Arc::clone(&taken),
        };
        // No connection times out during the test: the bound alone decides.
        let server = tokio::spawn(serve_from(
            queue,
            Arc::new(Metrics::new().unwrap()),
            Duration::from_secs(24 * 3600),
        ));
        let mut idle = Vec::new();
        for _ in 0..EXPORTER_CONNECTIONS_MAX {
            let (client, served) = tokio::io::duplex(64 << 10);
            sender.send(served).unwrap();
            idle.push(client);
        }
        let (mut waiting, served) = tokio::io::duplex(64 << 10);
        waiting
            .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        sender.send(served).unwrap();
        settle().await;
        let taken_now = || taken.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            taken_now(),
            EXPORTER_CONNECTIONS_MAX,
            "served past the connection bound"
        );
        // One idle connection closes: its slot serves the waiting one.
        drop(idle.pop());
        let mut reply = Vec::new();
        // A hang guard only: the reply needs no more than the close above.
        tokio::time::timeout(Duration::from_secs(120), waiting.read_to_end(&mut reply))
            .await
            .expect("the freed slot never served the waiting connection")
            .unwrap();
        assert!(reply.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert_eq!(taken_now(), EXPORTER_CONNECTIONS_MAX + 1);
        server.abort();
    }
}
