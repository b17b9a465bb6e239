//! A private `postgres` per test: `initdb` into a temporary directory, started on a free loopback
//! port with its socket in that directory, stopped (immediate mode) and removed when dropped.
//!
//! ```no_run
//! use jobguard_testkit::postgres::PgServer;
//!
//! let Some(server) = PgServer::start() else { return }; // skipped: no postgres binaries
//! println!("{}", server.url()); // postgres://postgres@127.0.0.1:PORT/postgres
//! ```
//!
//! The binaries (`initdb`, `pg_ctl`) are taken from `$JOBGUARD_POSTGRES_BIN` (a directory), else
//! from the directory of the `initdb` found on `PATH`, else from the newest
//! `/usr/lib/postgresql/*/bin` (Debian's layout). Without them, [`PgServer::start`] prints why
//! the test is skipped and returns `None`, unless `JOBGUARD_REQUIRE_POSTGRES=1` (as in CI), where
//! it panics instead.
//!
//! Postgres refuses to run as root: when the tests run as root, the directory is handed to the
//! `postgres` system user and every command runs as that user through `runuser` (or `su`).
//!
//! Only the standard library is used, so a test can include this file with `#[path]`.

use crate::process::{free_port, is_executable, unique_dir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Set to `1` to make missing Postgres binaries a test failure rather than a skip.
pub const REQUIRE_ENV: &str = "JOBGUARD_REQUIRE_POSTGRES";
/// Names the directory holding `initdb` and `pg_ctl`, instead of searching for them.
pub const BIN_ENV: &str = "JOBGUARD_POSTGRES_BIN";

/// The system user the server runs as when the tests run as root.
const SERVICE_USER: &str = "postgres";

/// Seconds `pg_ctl` waits for the server to accept connections (it polls; this is the limit).
const READY_WITHIN_SECS: &str = "30";

/// A `postgres` this process started and owns: superuser `postgres`, trust authentication on
/// loopback, database `postgres`. Dropping it stops the server and removes its directory.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_service_user: bool,
    running: bool,
}

impl PgServer {
    /// Creates a cluster, starts it on a free loopback port and waits until it accepts
    /// connections, or returns `None` (after printing why) when no Postgres binaries are found.
    ///
    /// # Panics
    ///
    /// When no binaries are found and `JOBGUARD_REQUIRE_POSTGRES=1`, or when `initdb` fails or
    /// the server does not come up (the message carries the end of its log).
    pub fn start() -> Option<PgServer> {
        let Some(bin) = find_bin() else {
            let why = format!(
                "no Postgres binaries (initdb, pg_ctl): set {BIN_ENV} to their directory or put \
                 initdb on PATH (Debian: apt-get install postgresql)"
            );
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!("{REQUIRE_ENV}=1 but {why}");
            }
            eprintln!("skipping: {why}");
            return None;
        };
        let dir = unique_dir("jgpg");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let as_service_user = is_root();
        let mut server = PgServer {
            bin,
            dir,
            port: 0,
            as_service_user,
            running: false,
        };
        if as_service_user {
            let chown = Command::new("chown")
                .arg(format!("{SERVICE_USER}:"))
                .arg(&server.dir)
                .status()
                .expect("run chown");
            assert!(
                chown.success(),
                "chown {SERVICE_USER} {}",
                server.dir.display()
            );
        }
        let data = server.data_dir();
        let out = server.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-A".as_ref(),
                "trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        assert!(
            out.status.success(),
            "initdb failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A port found free can be taken before the server binds it; then try another.
        for _ in 0..10 {
            server.port = free_port(5432);
            if server.pg_ctl_start() {
                return Some(server);
            }
        }
        panic!(
            "postgres did not start on any of 10 ports; its log ends:\n{}",
            server.log_tail()
        );
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The loopback port the server listens on; it keeps it across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: no checkpoint, clients cut off) and
    /// waits until it has exited. Its data stays, and [`restart`](Self::restart) recovers it.
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let data = self.data_dir();
        let out = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        );
        if !out.status.success() {
            eprintln!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.running = false;
    }

    /// Starts the stopped server again on the same port and data, and waits until it accepts
    /// connections.
    ///
    /// # Panics
    ///
    /// When it does not come up.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..10 {
            if self.pg_ctl_start() {
                return;
            }
        }
        panic!(
            "postgres did not restart on port {}; its log ends:\n{}",
            self.port,
            self.log_tail()
        );
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (pg_ctl polls it), or
    /// `false` when it exited (the port was taken) or did not answer in time.
    fn pg_ctl_start(&mut self) -> bool {
        let data = self.data_dir();
        let log = self.dir.join("postgres.log");
        // `fsync=off`: a committed transaction survives the server's crash (`stop`), which the
        // tests use, though not the machine's. `synchronous_commit` stays on for that reason.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c full_page_writes=off -c max_connections=200 -c deadlock_timeout=100ms",
            self.port,
            self.dir.display()
        );
        let out = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-t".as_ref(),
                READY_WITHIN_SECS.as_ref(),
                "-w".as_ref(),
                "start".as_ref(),
            ],
        );
        self.running = out.status.success();
        self.running
    }

    /// Runs one of the binaries, as the service user when we are root.
    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Output {
        let binary = self.bin.join(program);
        let mut cmd = if self.as_service_user {
            let mut cmd = Command::new(runuser());
            if runuser().ends_with("runuser") {
                cmd.args(["-u", SERVICE_USER, "--"]).arg(&binary).args(args);
            } else {
                // `su postgres -s /bin/sh -c 'exec "$0" "$@"' BINARY ARGS...`
                cmd.args([SERVICE_USER, "-s", "/bin/sh", "-c", r#"exec "$0" "$@""#])
                    .arg(&binary)
                    .args(args);
            }
            cmd
        } else {
            let mut cmd = Command::new(&binary);
            cmd.args(args);
            cmd
        };
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn runuser() -> &'static str {
    if Path::new("/usr/sbin/runuser").exists() {
        "/usr/sbin/runuser"
    } else if Path::new("/sbin/runuser").exists() {
        "/sbin/runuser"
    } else {
        "su"
    }
}

fn is_root() -> bool {
    // The effective uid without libc: `id -u`, with /proc as the source when `id` is missing.
    if let Ok(out) = Command::new("id").arg("-u").output() {
        return String::from_utf8_lossy(&out.stdout).trim() == "0";
    }
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

fn find_bin() -> Option<PathBuf> {
    let has_tools =
        |dir: &Path| is_executable(&dir.join("initdb")) && is_executable(&dir.join("pg_ctl"));
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        let dir = PathBuf::from(dir);
        return has_tools(&dir).then_some(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = std::env::split_paths(&path)
        .map(|dir| dir.join("initdb"))
        .find(|candidate| is_executable(candidate))
        .and_then(|initdb| std::fs::canonicalize(initdb).ok())
        .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
        .filter(|dir| has_tools(dir));
    if on_path.is_some() {
        return on_path;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_tools(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}
