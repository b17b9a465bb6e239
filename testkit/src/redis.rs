//! A private `redis-server` per test: started on a free loopback port in its own temporary
//! directory, with persistence off, killed when dropped.
//!
//! ```no_run
//! use jobguard_testkit::redis::RedisServer;
//!
//! let Some(server) = RedisServer::start() else { return }; // skipped: no redis-server
//! println!("{}", server.url()); // redis://127.0.0.1:PORT/
//! ```
//!
//! The binary is `$JOBGUARD_REDIS_SERVER`, else `redis-server` on `PATH`. Without one,
//! [`RedisServer::start`] prints why the test is skipped and returns `None`, unless
//! `JOBGUARD_REQUIRE_REDIS=1` (as in CI), where it panics instead. It never uses port 6379 or
//! a server it did not start.

use crate::process::{free_port, on_path, unique_dir};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` to make a missing `redis-server` a test failure rather than a skip.
pub const REQUIRE_ENV: &str = "JOBGUARD_REQUIRE_REDIS";
/// Names the `redis-server` binary to run, instead of searching `PATH`.
pub const BINARY_ENV: &str = "JOBGUARD_REDIS_SERVER";

/// How long a server may take to answer after it was spawned.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// How [`RedisServer::start_with`] configures the server, beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `requirepass`: clients authenticate with this password (the URLs carry it).
    pub password: Option<String>,
    /// Also listen with TLS on a second port, with these PEM files.
    pub tls: Option<TlsFiles>,
}

/// The PEM files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// The CA that signed it (`tls-ca-cert-file`; clients are not asked for certificates).
    pub ca: PathBuf,
}

/// A `redis-server` this process started and owns. Dropping it kills the server and removes its
/// directory.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    options: Options,
    port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers, or returns `None`
    /// (after printing why) when no `redis-server` binary is found.
    ///
    /// # Panics
    ///
    /// When no binary is found and `JOBGUARD_REQUIRE_REDIS=1`, or when the server does not come
    /// up (the message carries the end of its log).
    pub fn start() -> Option<RedisServer> {
        Self::start_with(Options::default())
    }

    /// [`start`](Self::start) with a password and/or a TLS listener.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: Options) -> Option<RedisServer> {
        let Some(binary) = find_binary() else {
            let why = format!(
                "no redis-server binary: set {BINARY_ENV} or put redis-server on PATH \
                 (Debian: apt-get install redis-server)"
            );
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE_ENV}=1 but {why}");
            }
            eprintln!("skipping: {why}");
            return None;
        };
        let dir = unique_dir("jobguard-redis");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut server = RedisServer {
            binary,
            options,
            port: 0,
            tls_port: None,
            dir,
            child: None,
        };
        // A port found free can be taken before the server binds it; then try another.
        for _ in 0..10 {
            server.port = free_port(6379);
            if server.options.tls.is_some() {
                server.tls_port = Some(free_port(6379));
            }
            if server.spawn_and_wait() {
                return Some(server);
            }
        }
        panic!(
            "redis-server did not start on any of 10 ports; its log ends:\n{}",
            server.log_tail()
        );
    }

    /// `redis://127.0.0.1:PORT/`, or `redis://:PASSWORD@127.0.0.1:PORT/` with a password.
    pub fn url(&self) -> String {
        format!("redis://{}127.0.0.1:{}/", self.auth(), self.port)
    }

    /// `rediss://[:PASSWORD@]127.0.0.1:TLS_PORT/` when the server has a TLS listener.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://{}127.0.0.1:{port}/", self.auth()))
    }

    fn auth(&self) -> String {
        self.options
            .password
            .as_ref()
            .map_or_else(String::new, |pw| format!(":{pw}@"))
    }

    /// The loopback port the server listens on; it keeps it across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL: no shutdown, no save) and waits for it to exit. Its data is
    /// lost, as persistence is off.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs, and starts a fresh one on the same port.
    ///
    /// # Panics
    ///
    /// When the port cannot be bound again or the server does not answer in time.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if self.spawn_and_wait() {
                return;
            }
        }
        panic!(
            "redis-server did not restart on port {}; its log ends:\n{}",
            self.port,
            self.log_tail()
        );
    }

    /// Spawns the server on `self.port` and polls until it answers as the process we spawned;
    /// `false` when it exited (the port was taken) or did not answer in time.
    fn spawn_and_wait(&mut self) -> bool {
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--port").arg(self.port.to_string());
        if let Some(pw) = &self.options.password {
            cmd.arg("--requirepass").arg(pw);
        }
        if let (Some(tls), Some(port)) = (&self.options.tls, self.tls_port) {
            cmd.arg("--tls-port").arg(port.to_string());
            cmd.arg("--tls-cert-file").arg(&tls.cert);
            cmd.arg("--tls-key-file").arg(&tls.key);
            cmd.arg("--tls-ca-cert-file").arg(&tls.ca);
            cmd.args(["--tls-auth-clients", "no"]);
        }
        let child = cmd
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--databases", "1"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.binary.display()));
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("spawned above");
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return false;
            }
            if answering_pid(self.port, self.options.password.as_deref()) == Some(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop();
        false
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command that runs one test of the current test binary in a child process:
/// `current_exe() TEST --exact --nocapture --include-ignored --test-threads=1`. Set an
/// environment variable on it to select the child's role.
///
/// # Panics
///
/// When the current executable cannot be found.
pub fn rerun_test(test: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        test,
        "--exact",
        "--nocapture",
        "--include-ignored",
        "--test-threads=1",
    ]);
    cmd
}

fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        return Some(PathBuf::from(path));
    }
    on_path("redis-server")
}

/// The `process_id` that the server on `port` reports in `INFO server`, if one answers.
fn answering_pid(port: u16, password: Option<&str>) -> Option<u32> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut request = Vec::new();
    if let Some(pw) = password {
        request
            .extend_from_slice(format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{pw}\r\n", pw.len()).as_bytes());
    }
    request.extend_from_slice(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n");
    stream.write_all(&request).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        reply.extend_from_slice(&buf[..n]);
        if password.is_some() {
            // AUTH answers `+OK`; a wrong one is an error, and not ready.
            if reply.len() < 5 {
                continue;
            }
            if !reply.starts_with(b"+OK\r\n") {
                return None;
            }
            if reply.len() == 5 {
                continue;
            }
        }
        let body = if password.is_some() {
            &reply[5..]
        } else {
            &reply[..]
        };
        // A bulk reply: `$LEN\r\n` then LEN bytes and `\r\n`; anything else (`-LOADING`) is not ready.
        if body[0] != b'$' {
            return None;
        }
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let len: usize = std::str::from_utf8(&body[1..eol]).ok()?.parse().ok()?;
        if body.len() >= eol + 2 + len {
            let text = String::from_utf8_lossy(&body[eol + 2..eol + 2 + len]);
            return text
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|pid| pid.trim().parse().ok());
        }
    }
}

/// The script calls (`EVALSHA` and `EVAL`) the server behind `connection` has run, from its
/// `INFO commandstats`: each is one round trip of a `RedisStore` operation. `INFO` itself is
/// not a script call, so asking does not move the count.
pub async fn script_calls<C: redis::aio::ConnectionLike>(connection: &mut C) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
