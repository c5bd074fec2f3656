//! The suite's child processes: each palisade service and each reference worker, started with
//! the suite's environment, killed (SIGKILL), paused (SIGSTOP/SIGCONT) and started again. Each
//! process's stderr goes to its own log file (appended across restarts); the reaper's sweep
//! lines on stdout become leader intervals.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// A palisade service the suite runs as its own process (`test-service <name>`).
pub use messages::Service;

/// One reaper sweep seen on a replica's stdout: when it started and (unless the replica died
/// in it) finished, in Unix milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    pub replica: usize,
    pub started_ms: u128,
    pub finished_ms: Option<u128>,
}

/// Every sweep of every reaper replica so far.
pub type Sweeps = Arc<Mutex<Vec<Sweep>>>;

pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
}

/// One child process: what it runs, and the running child when it runs.
pub struct Process {
    /// `admission`, `reaper-1`, `worker-2`: names its log file.
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    /// Where its `/readyz` answers, for services.
    pub http_addr: Option<std::net::SocketAddr>,
    /// The network namespace it runs in, when the suite has a network of its own.
    host: Option<crate::netns::Host>,
    /// The reaper replica index whose sweeps this process prints.
    sweeps: Option<(usize, Sweeps)>,
    child: Option<Child>,
    paused: bool,
}

impl Process {
    pub fn new(
        name: impl Into<String>,
        program: &Path,
        args: &[&str],
        env: Vec<(String, String)>,
        logs: &Path,
    ) -> Self {
        let name = name.into();
        Self {
            log: logs.join(format!("{name}.log")),
            name,
            program: program.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env,
            http_addr: None,
            host: None,
            sweeps: None,
            child: None,
            paused: false,
        }
    }

    /// Runs in `host` (a network namespace of the suite's network) when there is one.
    pub fn in_host(mut self, host: Option<crate::netns::Host>) -> Self {
        self.host = host;
        self
    }

    /// The namespace it runs in, if any.
    pub fn host(&self) -> Option<&crate::netns::Host> {
        self.host.as_ref()
    }

    /// Serves `/readyz` on `port`, at its host's address (loopback without a network).
    pub fn with_http_port(mut self, port: u16) -> Self {
        let address = self
            .host
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |host| host.address);
        let addr = std::net::SocketAddr::from((address, port));
        self.env
            .push(("PALISADE_HTTP_ADDR".into(), addr.to_string()));
        self.http_addr = Some(addr);
        self
    }

    /// Records the sweeps it prints as replica `replica`.
    pub fn with_sweeps(mut self, replica: usize, sweeps: Sweeps) -> Self {
        self.sweeps = Some((replica, sweeps));
        self
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file opens");
        let (program, args) = match &self.host {
            Some(host) => host.wrap(&self.program, &self.args),
            None => (self.program.display().to_string(), self.args.clone()),
        };
        let mut command = Command::new(&program);
        command
            .args(&args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stderr(Stdio::from(log))
            .stdout(if self.sweeps.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {program}: {error}"));
        if let Some((replica, sweeps)) = &self.sweeps {
            let stdout = child.stdout.take().expect("piped stdout");
            let (replica, sweeps) = (*replica, sweeps.clone());
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    record_sweep(&sweeps, replica, &line);
                }
            });
        }
        self.child = Some(child);
        self.paused = false;
    }

    /// SIGKILL: no goodbye. A sweep it was in ends now (a dead process sweeps nothing).
    pub async fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.paused {
            self.signal("CONT");
        }
        let _ = child.kill().await;
        if let Some((replica, sweeps)) = &self.sweeps {
            let killed_at = now_ms();
            for sweep in sweeps.lock().expect("not poisoned").iter_mut() {
                if sweep.replica == *replica && sweep.finished_ms.is_none() {
                    sweep.finished_ms = Some(killed_at);
                }
            }
        }
    }

    /// SIGSTOP until [`Process::resume`]: a process that wakes up believing nothing happened.
    pub fn pause(&mut self) {
        self.signal("STOP");
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.signal("CONT");
        self.paused = false;
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            crate::servers::signal(child, signal);
        }
    }

    /// Has it exited on its own (a crash the suite did not cause)? Its exit status if so.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Forgets a child that exited on its own (its status was read), so it can start again.
    pub fn forget(&mut self) {
        self.child = None;
        self.paused = false;
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.paused {
            crate::servers::signal(&child, "CONT");
        }
        crate::servers::signal(&child, "TERM");
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

/// `sweep started 1733030400123` / `sweep finished …` from `test-service reaper`.
fn record_sweep(sweeps: &Sweeps, replica: usize, line: &str) {
    let mut words = line.split_whitespace();
    let (Some("sweep"), Some(event), Some(millis)) = (
        words.next(),
        words.next(),
        words.next().and_then(|millis| millis.parse::<u128>().ok()),
    ) else {
        return;
    };
    let mut sweeps = sweeps.lock().expect("not poisoned");
    match event {
        "started" => sweeps.push(Sweep {
            replica,
            started_ms: millis,
            finished_ms: None,
        }),
        "finished" => {
            if let Some(open) = sweeps
                .iter_mut()
                .rev()
                .find(|sweep| sweep.replica == replica && sweep.finished_ms.is_none())
            {
                open.finished_ms = Some(millis);
            }
        }
        _ => {}
    }
}

/// Pairs of sweeps of different replicas that overlap in time: the reaper's leader intervals
/// must be disjoint (I9). A sweep still open counts as lasting until `now_ms`.
pub fn overlapping_sweeps(sweeps: &[Sweep], now_ms: u128) -> Vec<(Sweep, Sweep)> {
    let mut sorted = sweeps.to_vec();
    sorted.sort_by_key(|sweep| sweep.started_ms);
    let mut overlaps = Vec::new();
    for (index, first) in sorted.iter().enumerate() {
        let first_end = first.finished_ms.unwrap_or(now_ms);
        for second in &sorted[index + 1..] {
            if second.started_ms >= first_end {
                break;
            }
            if second.replica != first.replica {
                overlaps.push((*first, *second));
            }
        }
    }
    overlaps
}

/// A process's memory (resident, KiB) and open file descriptors now, from `/proc`; `None`
/// once it has exited.
pub fn usage(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss_kib, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(replica: usize, started_ms: u128, finished_ms: Option<u128>) -> Sweep {
        Sweep {
            replica,
            started_ms,
            finished_ms,
        }
    }

    #[test]
    fn overlapping_sweeps_of_two_replicas_are_found() {
        let disjoint = [
            sweep(0, 0, Some(10)),
            sweep(1, 10, Some(20)),
            sweep(0, 30, None),
        ];
        assert!(overlapping_sweeps(&disjoint, 40).is_empty());
        let overlapping = [sweep(0, 0, Some(10)), sweep(1, 5, Some(20))];
        assert_eq!(overlapping_sweeps(&overlapping, 40).len(), 1);
        let open = [sweep(0, 0, None), sweep(1, 30, Some(35))];
        assert_eq!(overlapping_sweeps(&open, 40).len(), 1);
    }
}
