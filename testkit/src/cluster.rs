//! A private Redis Cluster per test: 3 masters and 3 replicas, each a `redis-server
//! --cluster-enabled yes` on free loopback ports in one temporary directory, joined by
//! `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, and killed when dropped.
//!
//! ```text
//! let Some(cluster) = RedisCluster::start() else { return }; // skipped: no redis-server/redis-cli
//! let store = RedisStore::connect_cluster(&cluster.urls()).await?;
//! ```
//!
//! The binaries are `$JOBGUARD_REDIS_SERVER` (else `redis-server` on `PATH`) and
//! `$JOBGUARD_REDIS_CLI` (else `redis-cli` beside that `redis-server` or on `PATH`). Without
//! them, [`RedisCluster::start`] prints why the test is skipped and returns `None`, unless
//! `JOBGUARD_REQUIRE_REDIS=1` (as in CI), where it panics instead.
//!
//! Every wait polls the nodes (`CLUSTER INFO`, `CLUSTER NODES`, `INFO replication`) with a
//! deadline; none sleeps for a guessed time.

use crate::process::{free_port, is_executable, on_path, unique_dir};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::redis::BINARY_ENV as SERVER_ENV;
pub use crate::redis::REQUIRE_ENV;
/// Names the `redis-cli` binary to run, instead of searching beside `redis-server` and `PATH`.
pub const CLI_ENV: &str = "JOBGUARD_REDIS_CLI";

/// The number of slots of every Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the cluster may take to form, or to recover after a failover or a resharding.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How often the waits poll.
const POLL: Duration = Duration::from_millis(20);

/// How [`RedisCluster::start_with`] configures the nodes.
#[derive(Debug, Clone)]
pub struct Options {
    /// `cluster-node-timeout` in milliseconds: how long a master may be unreachable before its
    /// replica is promoted. Short, so that a failover test takes seconds; long enough that a
    /// busy machine does not fail over by accident.
    pub node_timeout_ms: u32,
    /// `requirepass` (and `masterauth`) on every node: clients authenticate with this password
    /// (the URLs carry it).
    pub password: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node_timeout_ms: 5000,
            password: None,
        }
    }
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id, 40 hex digits.
    pub id: String,
    /// The client port on 127.0.0.1.
    pub port: u16,
    /// A master (else a replica).
    pub master: bool,
    /// Marked `fail` or `pfail` by the node that answered.
    pub failing: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// The slot ranges it serves, inclusive, for a master.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    /// `true` when the node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A node process this cluster started.
#[derive(Debug)]
struct Node {
    port: u16,
    // Kept for the `Debug` form a failing test prints.
    #[allow(dead_code)]
    bus_port: u16,
    #[allow(dead_code)]
    dir: PathBuf,
    child: Option<Child>,
}

/// A Redis Cluster this process started and owns: 6 nodes, 3 masters with a replica each.
/// Dropping it kills every node and removes their directory.
#[derive(Debug)]
pub struct RedisCluster {
    server: PathBuf,
    cli: PathBuf,
    options: Options,
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts 6 nodes, creates the cluster, and waits until every node says
    /// `cluster_state:ok` and every replica is in sync; or returns `None` (after printing why)
    /// when `redis-server` or `redis-cli` is missing.
    ///
    /// # Panics
    ///
    /// When a binary is missing and `JOBGUARD_REQUIRE_REDIS=1`, or when the cluster does not
    /// form (the message says what was last seen).
    pub fn start() -> Option<RedisCluster> {
        Self::start_with(Options::default())
    }

    /// [`start`](Self::start) with other options.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: Options) -> Option<RedisCluster> {
        let (server, cli) = match (find_server(), find_cli()) {
            (Some(server), Some(cli)) => (server, cli),
            (server, _) => {
                let missing = if server.is_none() {
                    format!("no redis-server binary: set {SERVER_ENV} or put redis-server on PATH")
                } else {
                    format!("no redis-cli binary: set {CLI_ENV} or put redis-cli on PATH")
                };
                let why = format!("{missing} (Debian: apt-get install redis-server redis-tools)");
                if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                    panic!("{REQUIRE_ENV}=1 but {why}");
                }
                eprintln!("skipping: {why}");
                return None;
            }
        };
        let dir = unique_dir("jobguard-cluster");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut cluster = RedisCluster {
            server,
            cli,
            options,
            dir,
            nodes: Vec::new(),
        };
        for i in 0..6 {
            let node = cluster.spawn_node(i);
            cluster.nodes.push(node);
        }
        cluster.create();
        cluster.wait_until_ready(6);
        Some(cluster)
    }

    /// The client port of every node, masters and replicas, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis://127.0.0.1:PORT/` of every node (`redis://:PASSWORD@127.0.0.1:PORT/` with a
    /// password): seed nodes for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        let auth = self
            .options
            .password
            .as_ref()
            .map_or_else(String::new, |pw| format!(":{pw}@"));
        self.ports()
            .into_iter()
            .map(|p| format!("redis://{auth}127.0.0.1:{p}/"))
            .collect()
    }

    /// The ports of the nodes that run (not killed).
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// The cluster as a live node sees it (`CLUSTER NODES`).
    ///
    /// # Panics
    ///
    /// When no live node answers.
    pub fn topology(&self) -> Vec<NodeInfo> {
        for port in self.live_ports() {
            if let Ok(Reply::Bulk(text)) = self.query(port, &["CLUSTER", "NODES"]) {
                return parse_nodes(&text);
            }
        }
        panic!("no live cluster node answers CLUSTER NODES");
    }

    /// The masters, as [`topology`](Self::topology) sees them.
    pub fn masters(&self) -> Vec<NodeInfo> {
        self.topology().into_iter().filter(|n| n.master).collect()
    }

    /// The master that serves `slot`.
    ///
    /// # Panics
    ///
    /// When no master serves it.
    pub fn master_of(&self, slot: u16) -> NodeInfo {
        self.masters()
            .into_iter()
            .find(|n| n.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Kills the node on `port` with SIGKILL (no shutdown, no save) and waits for it to exit.
    ///
    /// # Panics
    ///
    /// When this cluster has no node on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until the replica of the killed master on `dead_port` has taken over: a live
    /// master serves every slot, and every live node says `cluster_state:ok`. Returns the new
    /// master.
    ///
    /// # Panics
    ///
    /// When that does not happen within a minute.
    pub fn wait_for_failover(&self, dead_port: u16) -> NodeInfo {
        let deadline = Instant::now() + READY_WITHIN;
        let live = self.live_ports();
        let mut seen = String::new();
        while Instant::now() < deadline {
            let views: Vec<Vec<NodeInfo>> = live
                .iter()
                .filter_map(|&p| match self.query(p, &["CLUSTER", "NODES"]) {
                    Ok(Reply::Bulk(text)) => Some(parse_nodes(&text)),
                    _ => None,
                })
                .collect();
            let promoted = views.len() == live.len()
                && views.iter().all(|view| {
                    let covered: u32 = view
                        .iter()
                        .filter(|n| n.master && !n.failing && n.port != dead_port)
                        .flat_map(|n| n.slots.iter())
                        .map(|&(a, b)| u32::from(b - a) + 1)
                        .sum();
                    covered == u32::from(SLOTS)
                });
            if promoted && live.iter().all(|&p| self.cluster_info(p).state_ok) {
                return self.promoted_master(&views[0], dead_port);
            }
            seen = format!("{views:?}");
            std::thread::sleep(POLL);
        }
        panic!(
            "no failover of the master on port {dead_port} within {READY_WITHIN:?}; last seen: {seen}"
        );
    }

    /// The live master that was the replica of the master on `dead_port`: the only live master
    /// without a live replica (each of the others kept its own).
    fn promoted_master(&self, view: &[NodeInfo], dead_port: u16) -> NodeInfo {
        let live = self.live_ports();
        view.iter()
            .filter(|n| n.master && live.contains(&n.port) && n.port != dead_port)
            .find(|m| {
                !view
                    .iter()
                    .any(|r| r.master_id.as_deref() == Some(&m.id) && live.contains(&r.port))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no promoted master in {view:?}"))
    }

    /// Moves `slots` slots from the master `from` to the master `to` (node ids) with
    /// `redis-cli --cluster reshard`, which takes the lowest slots `from` serves, and waits
    /// until every live node agrees again. Runs in the calling thread for as long as the
    /// migration takes.
    ///
    /// # Panics
    ///
    /// When `redis-cli` fails, or the cluster does not settle.
    pub fn reshard(&self, from: &str, to: &str, slots: u16) {
        let seed = format!("127.0.0.1:{}", self.live_ports()[0]);
        let mut cmd = Command::new(&self.cli);
        cmd.args(self.cli_auth())
            .args(["--cluster", "reshard", &seed])
            .args(["--cluster-from", from, "--cluster-to", to])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-yes", "--cluster-pipeline", "1"]);
        self.run_cli(cmd, "reshard");
        self.wait_until_ready(self.live_ports().len());
    }

    /// [`query_as`] with the cluster's password.
    pub fn query(&self, port: u16, args: &[&str]) -> std::io::Result<Reply> {
        query_as(port, self.options.password.as_deref(), args)
    }

    fn bulk(&self, port: u16, args: &[&str]) -> Option<String> {
        match self.query(port, args) {
            Ok(Reply::Bulk(text)) => Some(text),
            _ => None,
        }
    }

    fn cluster_info(&self, port: u16) -> ClusterInfo {
        cluster_info(self.bulk(port, &["CLUSTER", "INFO"]))
    }

    fn replica_in_sync(&self, port: u16) -> bool {
        replica_in_sync(self.bulk(port, &["INFO", "replication"]))
    }

    /// `-a PASSWORD` for `redis-cli`, when there is one.
    fn cli_auth(&self) -> Vec<String> {
        match &self.options.password {
            Some(pw) => vec!["-a".into(), pw.clone(), "--no-auth-warning".into()],
            None => Vec::new(),
        }
    }

    /// Spawns node `i` on free ports and waits until it answers as the process spawned.
    fn spawn_node(&self, i: usize) -> Node {
        let dir = self.dir.join(format!("node-{i}"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        // A port found free can be taken before the server binds it; then try others.
        for _ in 0..10 {
            let (port, bus_port) = (free_port(6379), free_port(6379));
            if port == bus_port {
                continue;
            }
            let mut cmd = Command::new(&self.server);
            if let Some(pw) = &self.options.password {
                cmd.args(["--requirepass", pw, "--masterauth", pw]);
            }
            let child = cmd
                .args(["--port", &port.to_string()])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-port", &bus_port.to_string()])
                .args(["--cluster-config-file", "nodes.conf"])
                .args([
                    "--cluster-node-timeout",
                    &self.options.node_timeout_ms.to_string(),
                ])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.server.display()));
            let mut node = Node {
                port,
                bus_port,
                dir: dir.clone(),
                child: Some(child),
            };
            if wait_for_pid(&mut node, self.options.password.as_deref()) {
                return node;
            }
        }
        panic!(
            "cluster node {i} did not start on any of 10 ports; its log ends:\n{}",
            log_tail(&dir)
        );
    }

    /// `redis-cli --cluster create` over the 6 nodes, one replica per master.
    fn create(&self) {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut cmd = Command::new(&self.cli);
        cmd.args(self.cli_auth())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"]);
        self.run_cli(cmd, "create");
    }

    /// Runs `redis-cli`, polling until it exits.
    ///
    /// # Panics
    ///
    /// When it fails, or runs for longer than a minute (it is killed then).
    fn run_cli(&self, mut cmd: Command, what: &str) {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.cli.display()));
        let deadline = Instant::now() + READY_WITHIN;
        let status = loop {
            if let Some(status) = child.try_wait().expect("redis-cli's status") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(POLL);
        };
        let out = child.wait_with_output().expect("redis-cli's output");
        let said = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match status {
            Some(status) if status.success() => {}
            Some(status) => panic!("redis-cli --cluster {what} failed ({status}): {said}"),
            None => panic!("redis-cli --cluster {what} ran for over {READY_WITHIN:?}: {said}"),
        }
    }

    /// Polls until every live node says `cluster_state:ok` with all slots served and knows
    /// `known` nodes, and every live replica's link to its master is up and synced.
    fn wait_until_ready(&self, known: usize) {
        let deadline = Instant::now() + READY_WITHIN;
        let mut last = String::new();
        while Instant::now() < deadline {
            let live = self.live_ports();
            let infos: Vec<ClusterInfo> = live.iter().map(|&p| self.cluster_info(p)).collect();
            let formed = infos
                .iter()
                .all(|i| i.state_ok && i.slots_ok == SLOTS && i.known_nodes >= known);
            // Every node has learned every other's role: no master without slots but a dead one.
            let agreed = live
                .iter()
                .all(|&p| match self.query(p, &["CLUSTER", "NODES"]) {
                    Ok(Reply::Bulk(text)) => parse_nodes(&text)
                        .iter()
                        .all(|n| n.failing || !n.master || !n.slots.is_empty()),
                    _ => false,
                });
            if formed && agreed && live.iter().all(|&p| self.replica_in_sync(p)) {
                return;
            }
            last = format!("{infos:?}, roles agreed: {agreed}");
            std::thread::sleep(POLL);
        }
        panic!("the cluster did not settle within {READY_WITHIN:?}; last seen: {last}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of the part
/// between the first `{` and the next `}` when that part is not empty, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS
}

/// CRC16/XMODEM, the checksum Redis Cluster hashes keys with.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What `CLUSTER INFO` says, as far as the waits need it.
#[derive(Debug, Default, Clone, Copy)]
struct ClusterInfo {
    state_ok: bool,
    slots_ok: u16,
    known_nodes: usize,
}

fn cluster_info(text: Option<String>) -> ClusterInfo {
    let Some(text) = text else {
        return ClusterInfo::default();
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    ClusterInfo {
        state_ok: field("cluster_state") == Some("ok"),
        slots_ok: field("cluster_slots_ok")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        known_nodes: field("cluster_known_nodes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    }
}

/// `true` for a master, and for a replica whose link to its master is up and not syncing.
fn replica_in_sync(text: Option<String>) -> bool {
    let Some(text) = text else {
        return false;
    };
    if text.lines().any(|l| l.trim() == "role:master") {
        return true;
    }
    text.lines().any(|l| l.trim() == "master_link_status:up")
        && text
            .lines()
            .any(|l| l.trim() == "master_sync_in_progress:0")
}

/// `CLUSTER NODES` lines: `id ip:port@cport flags master ping pong epoch link slot...`.
fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let addr = fields[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeInfo {
                id: fields[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failing: flags.contains(&"fail") || flags.contains(&"fail?"),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// A RESP reply, as far as the test kit reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK` and the like.
    Status(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$n` text (lossily decoded), or nil.
    Bulk(String),
    /// `$-1` or `*-1`.
    Nil,
    /// `*n` items.
    Array(Vec<Reply>),
}

/// Sends one command to the node on `port` on a fresh connection and reads its reply.
pub fn query(port: u16, args: &[&str]) -> std::io::Result<Reply> {
    query_as(port, None, args)
}

/// [`query`] after `AUTH password`, when there is one; an `AUTH` that fails is its reply.
pub fn query_as(port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Reply> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = Vec::new();
    let mut encode = |args: &[&str]| {
        request.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            request.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    };
    if let Some(pw) = password {
        encode(&["AUTH", pw]);
    }
    encode(args);
    (&stream).write_all(&request)?;
    let mut reader = BufReader::new(&stream);
    if password.is_some() {
        let auth = read_reply(&mut reader)?;
        if auth != Reply::Status("OK".into()) {
            return Ok(auth);
        }
    }
    read_reply(&mut reader)
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(bad("connection closed"));
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(1.min(line.len()));
    let number = || rest.parse::<i64>().map_err(|_| bad(line));
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(number()?),
        "$" => match number()? {
            n if n < 0 => Reply::Nil,
            n => {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Reply::Bulk(String::from_utf8_lossy(&buf).into_owned())
            }
        },
        "*" => match number()? {
            n if n < 0 => Reply::Nil,
            n => Reply::Array((0..n).map(|_| read_reply(r)).collect::<Result<_, _>>()?),
        },
        _ => return Err(bad(line)),
    })
}

/// Polls until the node answers `INFO server` as the process we spawned; `false` when it
/// exited (a port was taken) or did not answer in time.
fn wait_for_pid(node: &mut Node, password: Option<&str>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    let Some(pid) = node.child.as_ref().map(Child::id) else {
        return false;
    };
    while Instant::now() < deadline {
        let child = node.child.as_mut().expect("spawned");
        if let Ok(Some(_)) = child.try_wait() {
            node.child = None;
            return false;
        }
        if let Ok(Reply::Bulk(text)) = query_as(node.port, password, &["INFO", "server"]) {
            let answering: Option<u32> = text
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse().ok());
            if answering == Some(pid) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(mut child) = node.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    false
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn find_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(SERVER_ENV) {
        return Some(PathBuf::from(path));
    }
    on_path("redis-server")
}

fn find_cli() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(CLI_ENV) {
        return Some(PathBuf::from(path));
    }
    let beside_server = std::env::var_os(SERVER_ENV)
        .map(PathBuf::from)
        .and_then(|s| Some(s.parent()?.join("redis-cli")))
        .filter(|p| is_executable(p));
    beside_server.or_else(|| on_path("redis-cli"))
}
