//! What the private servers share: finding a binary, a temporary directory of their own, and a
//! free loopback port.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// `name` on `PATH`, or in `/usr/bin` or `/usr/sbin`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// A file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A fresh path in the temporary directory, `prefix` then the process id, a counter and the
/// clock's nanoseconds, so that concurrent tests and processes never share one.
pub(crate) fn unique_dir(prefix: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("{prefix}-{}-{n}-{nanos}", std::process::id()))
}

/// A loopback port that was free a moment ago, never `avoid` (the server's well-known port,
/// where a server this test did not start may listen).
pub(crate) fn free_port(avoid: u16) -> u16 {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port != avoid {
            return port;
        }
    }
}
