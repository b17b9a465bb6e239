//! The machine's message brokers: RabbitMQ on `127.0.0.1:5672` (user `guest`, password `guest`)
//! and NATS with JetStream on `127.0.0.1:4222`. Unlike Redis and Postgres, the tests do not start
//! these: they use the servers the machine runs, each test under queue, stream and consumer names
//! of its own ([`unique_name`]), which it deletes at its end.
//!
//! ```no_run
//! use jobguard_testkit::broker::{Broker, unique_name};
//!
//! let Some(url) = Broker::RabbitMq.url() else { return }; // skipped: no server
//! let queue = unique_name("letters"); // jobguard-letters-PID-N-NANOS
//! # let _ = (url, queue);
//! ```
//!
//! Without a server answering on its port, [`Broker::url`] prints why the test is skipped and
//! returns `None`, unless `JOBGUARD_REQUIRE_RABBITMQ=1` / `JOBGUARD_REQUIRE_NATS=1` (as in CI),
//! where it panics instead. `JOBGUARD_RABBITMQ_URL` / `JOBGUARD_NATS_URL` name another server.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A broker the machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// RabbitMQ, over AMQP 0-9-1.
    RabbitMq,
    /// NATS with JetStream.
    Nats,
}

impl Broker {
    /// The variable that, set to `1`, makes a missing server a test failure rather than a skip.
    pub fn require_env(self) -> &'static str {
        match self {
            Broker::RabbitMq => "JOBGUARD_REQUIRE_RABBITMQ",
            Broker::Nats => "JOBGUARD_REQUIRE_NATS",
        }
    }

    /// The variable that names another server's URL.
    pub fn url_env(self) -> &'static str {
        match self {
            Broker::RabbitMq => "JOBGUARD_RABBITMQ_URL",
            Broker::Nats => "JOBGUARD_NATS_URL",
        }
    }

    /// The URL used without [`url_env`](Self::url_env).
    pub fn default_url(self) -> &'static str {
        match self {
            Broker::RabbitMq => "amqp://guest:guest@127.0.0.1:5672/%2f",
            Broker::Nats => "nats://127.0.0.1:4222",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "RabbitMQ",
            Broker::Nats => "NATS",
        }
    }

    /// The server's URL when something accepts connections on its port, else `None` after
    /// printing why the test is skipped.
    ///
    /// # Panics
    ///
    /// When nothing answers and the broker's [`require_env`](Self::require_env) is `1`.
    pub fn url(self) -> Option<String> {
        let url = std::env::var(self.url_env()).unwrap_or_else(|_| self.default_url().to_owned());
        if answers(&url) {
            return Some(url);
        }
        let why = format!(
            "no {} server answers at {url} (set {} to another)",
            self.name(),
            self.url_env()
        );
        if std::env::var(self.require_env()).is_ok_and(|v| v == "1") {
            panic!("{}=1 but {why}", self.require_env());
        }
        eprintln!("skipping: {why}");
        None
    }
}

/// Whether a TCP connection to the URL's host and port opens within a second.
fn answers(url: &str) -> bool {
    let Some(addr) = host_port(url) else {
        return false;
    };
    let Ok(addrs) = addr.to_socket_addrs() else {
        return false;
    };
    addrs
        .collect::<Vec<SocketAddr>>()
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok())
}

/// `host:port` of `scheme://[user[:password]@]host:port[/...]`.
fn host_port(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    host_port.contains(':').then(|| host_port.to_owned())
}

/// A name no other test, process or run uses: `jobguard-{what}-{pid}-{n}-{nanos}`, with only
/// letters, digits and `-` (valid for a queue, a stream and a consumer).
pub fn unique_name(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("jobguard-{what}-{}-{n}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_come_out_of_a_url() {
        assert_eq!(
            host_port("amqp://guest:guest@127.0.0.1:5672/%2f").as_deref(),
            Some("127.0.0.1:5672")
        );
        assert_eq!(
            host_port("nats://127.0.0.1:4222").as_deref(),
            Some("127.0.0.1:4222")
        );
        assert_eq!(host_port("nats://localhost"), None);
    }

    #[test]
    fn names_differ() {
        assert_ne!(unique_name("q"), unique_name("q"));
        assert!(
            unique_name("q")
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        );
    }
}
