//! Set elements straight to the kernel over nfnetlink. The proxy adds the elements of an empty
//! table this way: `nft -f` spends about 10 µs per element in its parser (BENCHMARKS.md), the
//! kernel a third of that. NetworkPolicy sends its element deletes and adds as one
//! [`Transaction`]: `nft -f` reads a large interval set back for its overlap checks, 0.2-0.45 s
//! per change whatever its size, where the kernel checks them itself. Chains, rules and sets
//! always go through `nft -f`.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const AF_INET: u8 = 2;

/// A set element field as nft stores it: every field padded to 4 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Ipv4,
    Proto,
    Port,
    /// `numgen`'s 32-bit result, in host byte order.
    Bucket,
}

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
    #[error("element {0:?} does not match its set's type")]
    Element(String),
    #[error("the kernel refused set elements of {set}: {source}")]
    Refused { set: String, source: io::Error },
    #[error("{0} bytes of element changes do not fit one netlink batch")]
    TooLarge(usize),
}

/// Appends `text` (`a . b . c`, nft syntax) encoded as `fields`.
fn encode(text: &str, fields: &[Field], out: &mut Vec<u8>) -> Result<(), NetlinkError> {
    let bad = || NetlinkError::Element(text.to_owned());
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != fields.len() {
        return Err(bad());
    }
    for (part, field) in parts.iter().zip(fields) {
        match field {
            Field::Ipv4 => out.extend(part.parse::<Ipv4Addr>().map_err(|_| bad())?.octets()),
            Field::Proto => {
                let p: u8 = match *part {
                    "tcp" => 6,
                    "udp" => 17,
                    "sctp" => 132,
                    _ => return Err(bad()),
                };
                out.extend([p, 0, 0, 0]);
            }
            Field::Port => {
                let p: u16 = part.parse().map_err(|_| bad())?;
                out.extend(p.to_be_bytes());
                out.extend([0, 0]);
            }
            Field::Bucket => out.extend(part.parse::<u32>().map_err(|_| bad())?.to_ne_bytes()),
        }
    }
    Ok(())
}

/// What a set's element values are.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Data {
    None,
    Verdict,
    Value(&'static [Field]),
}

struct Message {
    buf: Vec<u8>,
    /// Offsets of the nested attributes still open.
    open: Vec<usize>,
}

impl Message {
    fn new(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Self {
        let mut buf = Vec::with_capacity(65_536);
        buf.extend(0u32.to_ne_bytes()); // length, set by finish
        buf.extend(kind.to_ne_bytes());
        buf.extend(flags.to_ne_bytes());
        buf.extend(seq.to_ne_bytes());
        buf.extend(0u32.to_ne_bytes());
        buf.extend([family, 0]);
        buf.extend(res_id.to_be_bytes());
        Message { buf, open: Vec::new() }
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend((len as u16).to_ne_bytes());
        self.buf.extend(kind.to_ne_bytes());
        self.buf.extend(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn begin(&mut self, kind: u16) {
        self.open.push(self.buf.len());
        self.buf.extend(0u16.to_ne_bytes());
        self.buf.extend((kind | NLA_F_NESTED).to_ne_bytes());
    }

    fn end(&mut self) {
        if let Some(start) = self.open.pop() {
            let len = (self.buf.len() - start) as u16;
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A nested attribute's length is 16 bits: keep each message's element list well under it.
const ELEMENTS_PER_MESSAGE_BYTES: usize = 48 * 1024;
/// Messages per batch (each batch is one kernel transaction).
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// A netfilter netlink socket of the calling thread's network namespace, able to send a
/// whole batch at once.
fn socket() -> Result<OwnedFd, NetlinkError> {
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let size: libc::c_int = (BATCH_BYTES * 2) as libc::c_int;
    // SAFETY: setsockopt with a c_int value. SO_SNDBUFFORCE needs CAP_NET_ADMIN, which
    // programming rules needs anyway; a batch must fit in one send.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        );
    }

    // A batch the kernel drops without an answer must not hang the agent.
    let timeout = libc::timeval { tv_sec: 30, tv_usec: 0 };
    // SAFETY: setsockopt with a timeval value.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }

    Ok(sock)
}

/// Adds `elements` (key text, value text) to set `set` of `table`, in as many transactions as
/// the socket buffer allows. The table and set must exist; chains named by verdicts too.
pub(crate) fn add_elements(
    table: &str,
    set: &str,
    key: &[Field],
    data: Data,
    elements: &[(&str, &str)],
) -> Result<(), NetlinkError> {
    let sock = socket()?;
    let mut messages: Vec<Vec<u8>> = Vec::new();
    let mut seq = 1u32;
    let mut i = 0;
    let mut element = Vec::with_capacity(64);
    while i < elements.len() {
        let mut m = Message::new(
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
            seq,
            AF_INET,
            0,
        );
        seq += 1;
        m.attr(NFTA_SET_ELEM_LIST_TABLE, &cstr(table));
        m.attr(NFTA_SET_ELEM_LIST_SET, &cstr(set));
        m.begin(NFTA_SET_ELEM_LIST_ELEMENTS);
        let start = m.buf.len();
        while i < elements.len() && m.buf.len() - start < ELEMENTS_PER_MESSAGE_BYTES {
            let (k, v) = elements[i];
            m.begin(NFTA_LIST_ELEM);
            element.clear();
            encode(k, key, &mut element)?;
            m.begin(NFTA_SET_ELEM_KEY);
            m.attr(NFTA_DATA_VALUE, &element);
            m.end();
            match data {
                Data::None => {}
                Data::Value(fields) => {
                    element.clear();
                    encode(v, fields, &mut element)?;
                    m.begin(NFTA_SET_ELEM_DATA);
                    m.attr(NFTA_DATA_VALUE, &element);
                    m.end();
                }
                Data::Verdict => {
                    let chain = v.strip_prefix("goto ").ok_or_else(|| NetlinkError::Element(v.to_owned()))?;
                    m.begin(NFTA_SET_ELEM_DATA);
                    m.begin(NFTA_DATA_VERDICT);
                    m.attr(NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes());
                    m.attr(NFTA_VERDICT_CHAIN, &cstr(chain));
                    m.end();
                    m.end();
                }
            }
            m.end();
            i += 1;
        }
        m.end();
        messages.push(m.finish());
    }

    let mut pending = messages.as_slice();
    while !pending.is_empty() {
        let mut batch = Message::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES).finish();
        let mut count = 0;
        while count < pending.len() && (count == 0 || batch.len() + pending[count].len() < BATCH_BYTES) {
            batch.extend(&pending[count]);
            count += 1;
        }
        batch.extend(Message::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES).finish());
        send_and_ack(&sock, &batch, count).map_err(|source| NetlinkError::Refused { set: set.to_owned(), source })?;
        pending = &pending[count..];
    }
    Ok(())
}

/// Whether a [`Transaction`] adds or deletes elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Add,
    Delete,
}

/// What an element of a [`Transaction`] carries besides its key.
#[derive(Clone, Copy)]
enum Extra<'a> {
    /// An interval's last key.
    End(Option<&'a [u8]>),
    /// A verdict map's `jump chain`.
    Jump(&'a str),
}

/// Element changes of the sets of one table, committed by the kernel as one transaction (all
/// or nothing, in order: deletes put first free the room their replacements take).
pub(crate) struct Transaction {
    table: Vec<u8>,
    messages: Vec<Vec<u8>>,
    bytes: usize,
}

impl Transaction {
    pub(crate) fn new(table: &str) -> Transaction {
        Transaction { table: cstr(table), messages: Vec::new(), bytes: 0 }
    }

    /// Adds or deletes keys of set `set`: (key, key end) as the kernel stores them (fields
    /// padded to 4 bytes); the end only for interval sets of concatenated fields.
    pub(crate) fn elements<'a>(
        &mut self,
        change: Change,
        set: &str,
        keys: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) {
        self.push(change, set, keys.into_iter().map(|(key, end)| (key, Extra::End(end))));
    }

    /// Adds (key to `jump chain`) or deletes (by key) elements of verdict map `set`.
    pub(crate) fn jumps<'a>(
        &mut self,
        change: Change,
        set: &str,
        items: impl IntoIterator<Item = (&'a [u8], &'a str)>,
    ) {
        self.push(change, set, items.into_iter().map(|(key, chain)| (key, Extra::Jump(chain))));
    }

    fn push<'a>(&mut self, change: Change, set: &str, keys: impl Iterator<Item = (&'a [u8], Extra<'a>)>) {
        let kind = match change {
            Change::Add => NFT_MSG_NEWSETELEM,
            Change::Delete => NFT_MSG_DELSETELEM,
        };
        let flags = match change {
            Change::Add => NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
            Change::Delete => NLM_F_REQUEST | NLM_F_ACK,
        };
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            let seq = self.messages.len() as u32 + 1;
            let mut m = Message::new((NFNL_SUBSYS_NFTABLES << 8) | kind, flags, seq, AF_INET, 0);
            m.attr(NFTA_SET_ELEM_LIST_TABLE, &self.table);
            m.attr(NFTA_SET_ELEM_LIST_SET, &cstr(set));
            m.begin(NFTA_SET_ELEM_LIST_ELEMENTS);
            let start = m.buf.len();
            while m.buf.len() - start < ELEMENTS_PER_MESSAGE_BYTES
                && let Some((key, extra)) = keys.next()
            {
                m.begin(NFTA_LIST_ELEM);
                m.begin(NFTA_SET_ELEM_KEY);
                m.attr(NFTA_DATA_VALUE, key);
                m.end();
                match extra {
                    Extra::End(Some(end)) => {
                        m.begin(NFTA_SET_ELEM_KEY_END);
                        m.attr(NFTA_DATA_VALUE, end);
                        m.end();
                    }
                    // A deletion names the key alone.
                    Extra::Jump(chain) if change == Change::Add => {
                        m.begin(NFTA_SET_ELEM_DATA);
                        m.begin(NFTA_DATA_VERDICT);
                        m.attr(NFTA_VERDICT_CODE, &NFT_JUMP.to_be_bytes());
                        m.attr(NFTA_VERDICT_CHAIN, &cstr(chain));
                        m.end();
                        m.end();
                    }
                    Extra::End(None) | Extra::Jump(_) => {}
                }
                m.end();
            }
            m.end();
            let m = m.finish();
            self.bytes += m.len();
            self.messages.push(m);
        }
    }

    /// Sends the changes as one batch and waits for the kernel's verdict on each message.
    pub(crate) fn commit(self) -> Result<(), NetlinkError> {
        if self.messages.is_empty() {
            return Ok(());
        }
        if self.bytes + 64 > BATCH_BYTES {
            return Err(NetlinkError::TooLarge(self.bytes));
        }
        let sock = socket()?;
        let mut batch = Message::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES).finish();
        for m in &self.messages {
            batch.extend(m);
        }
        batch.extend(Message::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES).finish());
        let table = String::from_utf8_lossy(&self.table[..self.table.len() - 1]).into_owned();
        send_and_ack(&sock, &batch, self.messages.len()).map_err(|source| NetlinkError::Refused { set: table, source })
    }
}

/// Sends one batch and waits for the acknowledgement of each of its `count` messages.
fn send_and_ack(sock: &OwnedFd, batch: &[u8], count: usize) -> io::Result<()> {
    // SAFETY: sockaddr_nl zeroed is the kernel's address (pid 0).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sendto with a valid buffer and address.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            batch.as_ptr().cast(),
            batch.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut acked = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while acked < count {
        // SAFETY: recv into our buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= 16 {
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            if len < 16 || len > rest.len() {
                break;
            }
            if kind == NLMSG_ERROR && len >= 20 {
                let code = i32::from_ne_bytes([rest[16], rest[17], rest[18], rest[19]]);
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                acked += 1;
            }
            rest = &rest[(len + 3) & !3..];
        }
    }
    Ok(())
}
