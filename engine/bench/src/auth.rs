//! What authentication adds to each store request: the client's interceptor (the peer token's
//! header) and the server's check (a SHA-256 of the header compared in constant time), timed
//! alone, to set beside the server's CPU per write measured in the same run.

use gitplane_storage::remote::PeerToken;
use std::time::{Duration, Instant};
use tonic::{Request, service::Interceptor as _};

const ROUNDS: u32 = 200_000;

/// Per request: (client side, server side).
pub fn cost() -> (Duration, Duration) {
    let token = PeerToken::new(crate::procs::PEER_TOKEN).expect("a valid constant token");
    let (mut client, mut server) = (token.clone(), token.checker());
    // What every request costs anyway, to subtract: making it.
    let started = Instant::now();
    for _ in 0..ROUNDS {
        std::hint::black_box(Request::new(()));
    }
    let bare = started.elapsed();
    let started = Instant::now();
    let mut requests = Vec::with_capacity(ROUNDS as usize);
    for _ in 0..ROUNDS {
        requests.push(client.call(Request::new(())).expect("the client side never refuses"));
    }
    let sent = started.elapsed().saturating_sub(bare);
    let started = Instant::now();
    for request in requests {
        std::hint::black_box(server.call(request).expect("the cluster's own token is admitted"));
    }
    let checked = started.elapsed();
    (sent / ROUNDS, checked / ROUNDS)
}
