//! The I/O shell: UDP on dedicated threads (blocking receive, answer from the zone, send),
//! TCP and forwarding on the tokio runtime. Which addresses, and in which network namespace
//! the sockets are made, is the caller's choice (`Listeners`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::Message;
use ipnet::IpNet;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::message::{Outcome, Pending, Recursion, Transport, respond};
use super::state::Shared;

/// Limits and sizes of a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Threads receiving on each UDP socket.
    pub udp_threads: usize,
    /// TCP connections open at once; more are closed on accept.
    pub max_tcp_connections: usize,
    /// A TCP connection that sends no complete query for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// Queries waiting for upstream servers at once; more are answered REFUSED (CoreDNS'
    /// `max_concurrent`).
    pub max_forwards: usize,
    /// How long one upstream server gets before the next is tried.
    pub upstream_timeout: Duration,
    /// The clients whose queries for names outside the cluster are forwarded (BIND's
    /// `allow-recursion`); others get REFUSED for them, and cluster names only. The agent
    /// gives its Pods' range and the node's own addresses.
    pub allow_recursion: Vec<IpNet>,
}

/// Loopback, IPv4 and IPv6: this machine's own clients.
pub fn loopback() -> Vec<IpNet> {
    vec![
        IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
        IpNet::new_assert(IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
    ]
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            udp_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_tcp_connections: 256,
            tcp_idle_timeout: Duration::from_secs(10),
            max_forwards: 1024,
            upstream_timeout: Duration::from_secs(2),
            allow_recursion: loopback(),
        }
    }
}

/// Bound sockets to serve on.
#[derive(Debug, Default)]
pub struct Listeners {
    pub udp: Vec<UdpSocket>,
    pub tcp: Vec<TcpListener>,
}

impl Listeners {
    /// UDP and TCP on each address (a port 0 gets the same free port for both).
    pub fn bind(addrs: &[SocketAddr]) -> io::Result<Listeners> {
        let mut listeners = Listeners::default();
        for addr in addrs {
            let mut attempts = 0;
            let (udp, tcp) = loop {
                let udp = UdpSocket::bind(addr)?;
                match TcpListener::bind(udp.local_addr()?) {
                    Ok(tcp) => break (udp, tcp),
                    // The free UDP port was taken for TCP: try another.
                    Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse && attempts < 16 => {
                        attempts += 1;
                    }
                    Err(e) => return Err(e),
                }
            };
            listeners.udp.push(udp);
            listeners.tcp.push(tcp);
        }
        Ok(listeners)
    }
}

/// A running server; dropping it stops it.
pub struct Server {
    udp: Vec<SocketAddr>,
    tcp: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    stop_tasks: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    pub fn udp_addrs(&self) -> &[SocketAddr] {
        &self.udp
    }

    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp
    }

    /// Stops receiving and waits for the UDP threads (at most one receive timeout).
    pub fn shutdown(mut self) {
        self.stop_now();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    fn stop_now(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stop_tasks.send(true);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// How often an idle UDP thread looks at the stop flag.
const UDP_POLL: Duration = Duration::from_millis(200);
/// UDP queries are small; a larger datagram is cut and then fails to parse (FORMERR).
const UDP_BUFFER: usize = 4096;
/// Upstream servers tried for one query.
const MAX_UPSTREAM_TRIES: usize = 3;

pub(super) fn serve(shared: Arc<Shared>, listeners: Listeners, cfg: ServerConfig) -> io::Result<Server> {
    let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (stop_tasks, stopped) = watch::channel(false);
    let forwards = Arc::new(Semaphore::new(cfg.max_forwards));
    let recursion = RecursionFor(cfg.allow_recursion.into());
    let mut server = Server { udp: Vec::new(), tcp: Vec::new(), stop: stop.clone(), stop_tasks, threads: Vec::new() };
    for socket in listeners.udp {
        server.udp.push(socket.local_addr()?);
        socket.set_read_timeout(Some(UDP_POLL))?;
        for i in 0..cfg.udp_threads.max(1) {
            let worker = UdpWorker {
                socket: Arc::new(socket.try_clone()?),
                shared: shared.clone(),
                runtime: runtime.clone(),
                forwards: forwards.clone(),
                upstream_timeout: cfg.upstream_timeout,
                recursion: recursion.clone(),
                stop: stop.clone(),
            };
            let thread = std::thread::Builder::new().name(format!("dns-udp-{i}")).spawn(move || worker.run())?;
            server.threads.push(thread);
        }
    }
    let connections = Arc::new(Semaphore::new(cfg.max_tcp_connections));
    for listener in listeners.tcp {
        server.tcp.push(listener.local_addr()?);
        listener.set_nonblocking(true)?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let tcp = TcpContext {
            shared: shared.clone(),
            forwards: forwards.clone(),
            idle: cfg.tcp_idle_timeout,
            upstream_timeout: cfg.upstream_timeout,
            recursion: recursion.clone(),
        };
        runtime.spawn(accept_loop(listener, tcp, connections.clone(), stopped.clone()));
    }
    Ok(server)
}

/// Which clients may have recursion.
#[derive(Clone)]
struct RecursionFor(Arc<[IpNet]>);

impl RecursionFor {
    fn of(&self, client: IpAddr) -> Recursion {
        let client = client.to_canonical();
        if self.0.iter().any(|net| net.contains(&client)) { Recursion::Allowed } else { Recursion::Refused }
    }
}

struct UdpWorker {
    socket: Arc<UdpSocket>,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    forwards: Arc<Semaphore>,
    upstream_timeout: Duration,
    recursion: RecursionFor,
    stop: Arc<AtomicBool>,
}

impl UdpWorker {
    fn run(self) {
        let fd = self.socket.as_raw_fd();
        let mut batch = mmsg::Batch::new();
        let mut replies: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(mmsg::BATCH);
        let mut forwards: Vec<(Box<Pending>, SocketAddr)> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let received = match batch.recv(fd) {
                Ok(received) => received,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    // E.g. an ICMP error queued for an earlier reply: keep serving.
                    tracing::debug!(error = %e, "dns: udp receive");
                    continue;
                }
            };
            {
                // One read lock per batch: an update waits for at most one batch.
                let state = self.shared.read();
                for (packet, peer) in (0..received).filter_map(|i| batch.get(i)) {
                    let recursion = self.recursion.of(peer.ip());
                    match respond(&state.zone, &state.forwarding, packet, Transport::Udp, recursion) {
                        Outcome::Reply(bytes) => replies.push((bytes, peer)),
                        Outcome::Drop => {}
                        Outcome::Forward(pending) => forwards.push((pending, peer)),
                    }
                }
            }
            for (pending, peer) in forwards.drain(..) {
                match self.forwards.clone().try_acquire_owned() {
                    Err(_) => replies.push((pending.refused(), peer)),
                    Ok(permit) => {
                        let socket = self.socket.clone();
                        let timeout = self.upstream_timeout;
                        self.runtime.spawn(async move {
                            let reply = pending.finish(forward(&pending, timeout, permit).await);
                            // A datagram send does not wait for the peer; it may briefly
                            // block on a full socket buffer, which is acceptable here.
                            if let Err(e) = socket.send_to(&reply, peer) {
                                tracing::debug!(error = %e, %peer, "dns: udp send");
                            }
                        });
                    }
                }
            }
            mmsg::send(fd, &replies);
            replies.clear();
        }
    }
}

#[derive(Clone)]
struct TcpContext {
    shared: Arc<Shared>,
    forwards: Arc<Semaphore>,
    idle: Duration,
    upstream_timeout: Duration,
    recursion: RecursionFor,
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    tcp: TcpContext,
    connections: Arc<Semaphore>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stopped.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else { continue };
        // Over the limit the connection is closed at once, before reading anything.
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let tcp = tcp.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => {}
                _ = tcp.connection(stream, peer) => {}
            }
            drop(permit);
        });
    }
}

impl TcpContext {
    /// Queries one after another, each framed by its 2-byte length (RFC 1035 4.2.2).
    async fn connection(&self, mut stream: tokio::net::TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let recursion = self.recursion.of(peer.ip());
        loop {
            let Ok(Ok(len)) = tokio::time::timeout(self.idle, stream.read_u16()).await else { return };
            let mut query = vec![0u8; usize::from(len)];
            let Ok(Ok(_)) = tokio::time::timeout(self.idle, stream.read_exact(&mut query)).await else { return };
            let outcome = {
                let state = self.shared.read();
                respond(&state.zone, &state.forwarding, &query, Transport::Tcp, recursion)
            };
            let reply = match outcome {
                Outcome::Reply(bytes) => bytes,
                Outcome::Drop => return,
                Outcome::Forward(pending) => match self.forwards.clone().try_acquire_owned() {
                    Err(_) => pending.refused(),
                    Ok(permit) => pending.finish(forward(&pending, self.upstream_timeout, permit).await),
                },
            };
            let Ok(len) = u16::try_from(reply.len()) else { return };
            let mut framed = Vec::with_capacity(reply.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&reply);
            if !matches!(tokio::time::timeout(self.idle, stream.write_all(&framed)).await, Ok(Ok(()))) {
                return;
            }
        }
    }
}

/// Asks the upstream servers in order, over the client's transport (a truncated UDP answer
/// goes back truncated, and the client's TCP retry is forwarded over TCP).
async fn forward(pending: &Pending, timeout: Duration, _permit: OwnedSemaphorePermit) -> Option<Message> {
    for upstream in pending.upstreams.iter().take(MAX_UPSTREAM_TRIES) {
        let id = rand::random::<u16>();
        let asked = match pending.transport {
            Transport::Udp => tokio::time::timeout(timeout, ask_udp(pending, *upstream, id)).await,
            Transport::Tcp => tokio::time::timeout(timeout, ask_tcp(pending, *upstream, id)).await,
        };
        match asked {
            Ok(Ok(response)) => return Some(response),
            Ok(Err(e)) => tracing::debug!(error = %e, %upstream, "dns: upstream failed"),
            Err(_) => tracing::debug!(%upstream, "dns: upstream timed out"),
        }
    }
    tracing::info!(name = %pending.question().name(), "dns: no upstream answered");
    None
}

async fn ask_udp(pending: &Pending, upstream: SocketAddr, id: u16) -> io::Result<Message> {
    let local: SocketAddr = if upstream.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(&pending.upstream_query(id)).await?;
    let mut buf = vec![0u8; UDP_BUFFER];
    loop {
        let len = socket.recv(&mut buf).await?;
        if let Ok(response) = Message::from_vec(&buf[..len])
            && pending.accepts(id, &response)
        {
            return Ok(response);
        }
    }
}

async fn ask_tcp(pending: &Pending, upstream: SocketAddr, id: u16) -> io::Result<Message> {
    let mut stream = tokio::net::TcpStream::connect(upstream).await?;
    let query = pending.upstream_query(id);
    let len = u16::try_from(query.len()).map_err(io::Error::other)?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(&query);
    stream.write_all(&framed).await?;
    let len = stream.read_u16().await?;
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await?;
    let response = Message::from_vec(&buf).map_err(io::Error::other)?;
    if pending.accepts(id, &response) {
        Ok(response)
    } else {
        Err(io::Error::other("upstream answered another question"))
    }
}

/// recvmmsg / sendmmsg: one system call for many datagrams. Profiles showed the server's CPU
/// going mostly to the kernel's per-call work of recvfrom and sendto.
mod mmsg {
    use std::io;
    use std::mem::{size_of, zeroed};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::RawFd;

    use super::UDP_BUFFER;

    pub const BATCH: usize = 32;

    /// Receive buffers and the senders' addresses of one batch.
    pub struct Batch {
        bufs: Box<[[u8; UDP_BUFFER]; BATCH]>,
        addrs: Box<[libc::sockaddr_storage; BATCH]>,
        lens: [usize; BATCH],
    }

    impl Batch {
        pub fn new() -> Batch {
            // SAFETY: sockaddr_storage is plain data; all zeroes is a valid (empty) value.
            let addrs = Box::new(unsafe { zeroed::<[libc::sockaddr_storage; BATCH]>() });
            Batch { bufs: Box::new([[0; UDP_BUFFER]; BATCH]), addrs, lens: [0; BATCH] }
        }

        /// Waits for one datagram (up to the socket's receive timeout), then takes whatever
        /// else is queued, up to `BATCH`.
        pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
            // SAFETY: iovec and mmsghdr are plain data; zeroes are valid values.
            let mut iov: [libc::iovec; BATCH] = unsafe { zeroed() };
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
            for (i, (iov, hdr)) in iov.iter_mut().zip(hdrs.iter_mut()).enumerate() {
                iov.iov_base = self.bufs[i].as_mut_ptr().cast();
                iov.iov_len = UDP_BUFFER;
                hdr.msg_hdr.msg_name = (&raw mut self.addrs[i]).cast();
                hdr.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                hdr.msg_hdr.msg_iov = iov;
                hdr.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: every header points at a buffer, an iovec and an address slot owned by
            // `self` or this frame, all alive for the call; the kernel writes within their sizes.
            let received = unsafe {
                libc::recvmmsg(fd, hdrs.as_mut_ptr(), BATCH as libc::c_uint, libc::MSG_WAITFORONE, std::ptr::null_mut())
            };
            let received = usize::try_from(received).map_err(|_| io::Error::last_os_error())?;
            for (len, hdr) in self.lens.iter_mut().zip(&hdrs).take(received) {
                *len = (hdr.msg_len as usize).min(UDP_BUFFER);
            }
            Ok(received)
        }

        /// The `i`-th datagram of the last `recv` and its sender.
        pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
            Some((&self.bufs.get(i)?[..self.lens[i]], from_storage(&self.addrs[i])?))
        }
    }

    /// Sends every reply; one that fails (its sender gone, say) is skipped.
    pub fn send(fd: RawFd, replies: &[(Vec<u8>, SocketAddr)]) {
        for chunk in replies.chunks(BATCH) {
            // SAFETY: plain data, zeroes are valid values.
            let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
            let mut iov: [libc::iovec; BATCH] = unsafe { zeroed() };
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
            for (i, (bytes, peer)) in chunk.iter().enumerate() {
                let len = to_storage(*peer, &mut addrs[i]);
                iov[i].iov_base = bytes.as_ptr().cast_mut().cast();
                iov[i].iov_len = bytes.len();
                hdrs[i].msg_hdr.msg_name = (&raw mut addrs[i]).cast();
                hdrs[i].msg_hdr.msg_namelen = len;
                hdrs[i].msg_hdr.msg_iov = &raw mut iov[i];
                hdrs[i].msg_hdr.msg_iovlen = 1;
            }
            let mut start = 0;
            while start < chunk.len() {
                // SAFETY: headers `start..chunk.len()` point at addresses, iovecs and reply
                // bytes that outlive the call; the kernel only reads the data.
                let sent =
                    unsafe { libc::sendmmsg(fd, hdrs[start..].as_mut_ptr(), (chunk.len() - start) as libc::c_uint, 0) };
                match usize::try_from(sent) {
                    Ok(sent) if sent > 0 => start += sent,
                    _ => {
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::Interrupted {
                            tracing::debug!(error = %e, peer = %chunk[start].1, "dns: udp send");
                            start += 1;
                        }
                    }
                }
            }
        }
    }

    fn from_storage(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in, which it can hold.
                let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let port = u16::from_be(sin6.sin6_port);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)))
            }
            _ => None,
        }
    }

    fn to_storage(addr: SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
        match addr {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
                let sin = unsafe { &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            SocketAddr::V6(v6) => {
                // SAFETY: as above, for a sockaddr_in6.
                let sin6 = unsafe { &mut *(storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_flowinfo = v6.flowinfo();
                sin6.sin6_scope_id = v6.scope_id();
                size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn t10_socket_addresses_round_trip() {
            for addr in ["127.0.0.1:53", "10.96.0.10:5353", "[::1]:53", "[fe80::1%2]:1053"] {
                let addr: SocketAddr = addr.parse().unwrap();
                // SAFETY: zeroes are a valid sockaddr_storage.
                let mut storage = unsafe { zeroed() };
                to_storage(addr, &mut storage);
                assert_eq!(from_storage(&storage), Some(addr));
            }
        }
    }
}
