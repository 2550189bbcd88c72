//! An upgraded connection (WebSocket and the like): bytes copied both ways, as ingress-nginx
//! does after a 101, until either side closes or neither sends anything for the idle timeout
//! (ingress-nginx's `proxy-read-timeout` and `proxy-send-timeout`, 60 s), so a client that
//! vanished without closing does not hold an endpoint's connection for ever.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Instant,
};

/// How long an upgraded connection may carry nothing either way.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a tunnel ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed their sending halves.
    Closed,
    /// Nothing was read from either side for the idle timeout.
    Idle,
}

/// Copies between `client` and `upstream` until both have closed, either fails, or `idle`
/// passes without a byte read from either.
pub async fn tunnel<C, U>(client: C, upstream: U, idle: Duration) -> io::Result<Ended>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity { since: Instant::now(), last_ms: AtomicU64::new(0) });
    let mut client = Watched { inner: client, activity: activity.clone() };
    let mut upstream = Watched { inner: upstream, activity: activity.clone() };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => copied.map(|_| Ended::Closed),
        () = activity.idle_for(idle) => Ok(Ended::Idle),
    }
}

/// When a byte was last read from either side, in milliseconds since the tunnel opened.
struct Activity {
    since: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Returns once `idle` has passed since the last read.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream whose reads count as activity.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    const IDLE: Duration = Duration::from_secs(1);
    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn traffic_keeps_it_open_and_silence_ends_it() {
        let (mut client, proxy_client) = duplex(1024);
        let (proxy_upstream, mut upstream) = duplex(1024);
        let tunnel = tokio::spawn(tunnel(proxy_client, proxy_upstream, IDLE));
        // Messages both ways for twice the idle timeout, each well inside it.
        let started = Instant::now();
        while started.elapsed() < 2 * IDLE {
            client.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            upstream.read_exact(&mut got).await.unwrap();
            upstream.write_all(b"pong").await.unwrap();
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"pong");
            tokio::time::sleep(IDLE / 10).await;
        }
        assert!(!tunnel.is_finished(), "a tunnel in use was ended");
        // Then silence: the tunnel ends, and both sides see their connection closed.
        let ended = tokio::time::timeout(DEADLINE, tunnel).await.expect("the idle tunnel was not ended").unwrap();
        assert_eq!(ended.unwrap(), Ended::Idle);
        assert_eq!(client.read(&mut [0u8; 1]).await.unwrap(), 0);
        assert_eq!(upstream.read(&mut [0u8; 1]).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn both_sides_closing_ends_it() {
        let (mut client, proxy_client) = duplex(1024);
        let (proxy_upstream, mut upstream) = duplex(1024);
        let tunnel = tokio::spawn(tunnel(proxy_client, proxy_upstream, IDLE_TIMEOUT));
        client.shutdown().await.unwrap();
        assert_eq!(upstream.read(&mut [0u8; 1]).await.unwrap(), 0, "the close reaches the upstream");
        upstream.shutdown().await.unwrap();
        let ended = tokio::time::timeout(DEADLINE, tunnel).await.expect("the closed tunnel did not end").unwrap();
        assert_eq!(ended.unwrap(), Ended::Closed);
    }
}
