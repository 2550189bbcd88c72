//! Sockets in another network namespace: how a replica reaches nodes that `gitplane up
//! --nodes` runs behind a bridge of their own.

use std::{os::fd::AsRawFd, path::Path};

/// Runs `f` on a thread that has entered the network namespace at `netns`: sockets made there
/// keep that namespace; the calling thread's is not changed.
pub fn in_netns<T: Send>(netns: &Path, f: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<T> {
    let file = std::fs::File::open(netns)?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // SAFETY: setns on an open netns fd; it only affects this thread.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("thread in netns panicked")))
    })
}
