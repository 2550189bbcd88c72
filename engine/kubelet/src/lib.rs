//! The kubelet endpoint's contract, shared by the node agent that serves it and the API server
//! that calls it: its port, the Summary API's types ([`stats`]), the exec / attach /
//! port-forward streams' options and upgrade proxy ([`streaming`]), and how a caller reaches a
//! node that lives in a network namespace of its own ([`netns`]).

pub mod netns;
pub mod stats;
pub mod streaming;

/// The kubelet's default port.
pub const DEFAULT_PORT: u16 = 10250;

/// `a=1&b=x%3Ay` as pairs, percent-decoded (`+` is a space).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' => match bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                },
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}
