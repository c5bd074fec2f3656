//! The chaos suite: palisade's five services and its reference workers as separate processes,
//! on a PostgreSQL and a three-node NATS cluster (palisade's streams with three replicas) of
//! the suite's own, under a steady load with a ledger of
//! every request, while faults are injected on a schedule and the bus duplicates, delays and
//! reorders messages; then a checker ([`check`]) proves nothing was lost, duplicated or left
//! behind, and a [`Report`] says what each fault looked like (`/readyz`, the logs) and how long
//! the system took to make progress again.
//!
//! `tests/tests/chaos.rs` runs the bounded form ([`Plan::bounded`]: every fault once) in CI
//! and the soak ([`Plan::soak`]) on demand.

pub mod check;
mod injector;
mod ledger;
pub mod processes;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read as _, Seek as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bus::Bus;
use messages::Subjects;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use runtime::{CommonSettings, Connections};
use store::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use injector::Injection;
pub use processes::Service;

use crate::netns::Network;
use crate::servers::{NatsCluster, PostgresServer, free_port};
use ledger::{Ledger, SharedLedger};
use processes::{Process, Sweeps};

/// The suite's timing, short so that every fault plays out in seconds.
const ACK_WAIT: Duration = Duration::from_secs(1);
const MAX_DELIVER: u32 = 3;
const LEASE_TTL: Duration = Duration::from_secs(2);
const DB_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);
/// A paused process stays paused this long: past a lease TTL and an ack wait.
const PAUSE: Duration = Duration::from_secs(3);
/// A killed service or worker comes back after this long, as an orchestrator restarts it.
const RESTART_AFTER: Duration = Duration::from_millis(500);

/// The longest a message's deliveries can take to all fail while PostgreSQL is down: each
/// waits up to the pool's acquire timeout for a connection, then up to an ack wait (the
/// longest redelivery delay at these settings) for the next delivery. An outage longer than
/// this would have spent every message's budget, had the consumers not held them.
fn redelivery_budget() -> Duration {
    (ACK_WAIT + DB_ACQUIRE_TIMEOUT) * MAX_DELIVER
}

/// After a fault heals, a scan must finish within this long, or the system counts as stuck.
const PROGRESS_MAX: Duration = Duration::from_secs(30);

/// How long a network cut lasts: past a lease TTL and an ack wait.
const CUT: Duration = Duration::from_secs(5);

/// [`Fault::SlowLinks`]: every packet on the suite's network held 200 ms to 250 ms each way
/// (so some overtake others) and dropped with a probability of 5 %…
const SLOW_LINK: crate::impair::Link = crate::impair::Link {
    delay: Duration::from_millis(200),
    jitter: Duration::from_millis(50),
    loss: 0.05,
};
/// …for this long.
const SLOW_LINKS: Duration = Duration::from_secs(60);

/// How long a NATS node stays frozen or cut from its peers: past the window in which its
/// peers give up on a silent route ([`NatsCluster::PING_INTERVAL`] × [`NatsCluster::PING_MAX`],
/// 10 s), so they drop it and elect leaders without it.
const NODE_FAULT: Duration = Duration::from_secs(12);

/// How long [`Fault::PostgresDown`] lasts.
fn postgres_down() -> Duration {
    redelivery_budget() + Duration::from_secs(4)
}

/// One fault the suite injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL one replica of the service; it is started again after [`RESTART_AFTER`].
    Kill(Service),
    /// SIGSTOP one replica for [`PAUSE`], then SIGCONT.
    Pause(Service),
    /// SIGKILL a worker mid-task; it starts again (same identity) after [`RESTART_AFTER`].
    KillWorker,
    /// SIGSTOP a worker for [`PAUSE`] (past its lease TTL), then SIGCONT.
    PauseWorker,
    /// PostgreSQL stopped (fast shutdown) and started again at once.
    PostgresRestart,
    /// PostgreSQL down longer than every message's redelivery budget ([`redelivery_budget`]).
    PostgresDown,
    /// Every palisade backend terminated (`pg_terminate_backend`).
    TerminateBackends,
    /// Every connection pool exhausted: an exclusive lock on `scans` and `worker_tasks` held
    /// past the pools' acquire timeout, so decisions wait on it and the rest find no
    /// connection.
    PoolExhausted,
    /// Every NATS node SIGKILLed at once and started again on its JetStream store.
    NatsRestart,
    /// One NATS node SIGKILLed and started again after [`RESTART_AFTER`].
    NatsNodeKill,
    /// One NATS node frozen (SIGSTOP) for [`NODE_FAULT`]: its clients and peers hear
    /// nothing, their connections stay open.
    NatsNodeFreeze,
    /// One NATS node cut from its two peers for [`NODE_FAULT`] while every client stays
    /// connected to it and they to theirs: the node alone is the minority side, its peers the
    /// majority. Which node: the requests stream's leader, or a node that does not lead it.
    NatsNodePartition(Side),
    /// Every link of the suite's network slow, reordering and lossy ([`SLOW_LINK`]) for
    /// [`SLOW_LINKS`]: between services, workers, NATS nodes and PostgreSQL alike
    /// ([`crate::impair`]).
    SlowLinks,
    /// One replica of the service cut from NATS for [`CUT`] (its packets to the server
    /// dropped; the process alive, its connection open), then healed.
    CutFromNats(Service),
    /// A worker cut from everything (its link down) for [`CUT`], past its lease TTL.
    IsolateWorker,
    /// PostgreSQL unreachable from the service's replicas, and only from them, for as long as
    /// [`Fault::PostgresDown`] lasts.
    PostgresCutFrom(Service),
}

/// Where the requests stream's leader is when a NATS node is partitioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The cut node leads it: the leader is on the minority side and must be replaced.
    Leader,
    /// The cut node does not lead it: the leader stays with the majority.
    Follower,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Leader => "leader",
            Side::Follower => "follower",
        }
    }
}

impl Fault {
    /// Every fault, each service killed and (but for the reaper, whose pause the lease
    /// protocol cannot stop from acting once it wakes) paused.
    pub fn all() -> Vec<Fault> {
        let mut faults: Vec<Fault> = Service::ALL.iter().map(|s| Fault::Kill(*s)).collect();
        faults.extend(
            [Service::Admission, Service::Dispatch, Service::Ingestion]
                .iter()
                .map(|s| Fault::Pause(*s)),
        );
        faults.extend([
            Fault::KillWorker,
            Fault::PauseWorker,
            Fault::PostgresRestart,
            Fault::PostgresDown,
            Fault::TerminateBackends,
            Fault::PoolExhausted,
            Fault::NatsRestart,
            Fault::NatsNodeKill,
            Fault::NatsNodeFreeze,
        ]);
        faults
    }

    /// The faults that cut a network link: they need [`crate::netns`].
    pub fn network() -> Vec<Fault> {
        let mut faults: Vec<Fault> = [Service::Admission, Service::Dispatch, Service::Ingestion]
            .into_iter()
            .map(Fault::CutFromNats)
            .collect();
        faults.extend([
            Fault::IsolateWorker,
            Fault::PostgresCutFrom(Service::Ingestion),
            Fault::NatsNodePartition(Side::Leader),
            Fault::NatsNodePartition(Side::Follower),
            Fault::SlowLinks,
        ]);
        faults
    }

    fn is_network(self) -> bool {
        matches!(
            self,
            Fault::CutFromNats(_)
                | Fault::IsolateWorker
                | Fault::PostgresCutFrom(_)
                | Fault::NatsNodePartition(_)
                | Fault::SlowLinks
        )
    }
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// `kill:<service>`, `pause:<service>`, `kill-worker`, `pause-worker`, `postgres-restart`,
    /// `postgres-down`, `terminate-backends`, `pool-exhausted`, `nats-restart`,
    /// `nats-node-kill`, `nats-node-freeze`, `nats-node-partition:leader|follower`, `slow-links`,
    /// `cut-from-nats:<service>`, `isolate-worker`, `postgres-cut-from:<service>`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let service = |name: &str| {
            Service::ALL
                .into_iter()
                .find(|service| service.name() == name)
                .ok_or_else(|| format!("no service {name:?}"))
        };
        Ok(match text.split_once(':') {
            Some(("kill", name)) => Fault::Kill(service(name)?),
            Some(("pause", name)) => Fault::Pause(service(name)?),
            Some(("cut-from-nats", name)) => Fault::CutFromNats(service(name)?),
            Some(("postgres-cut-from", name)) => Fault::PostgresCutFrom(service(name)?),
            Some(("nats-node-partition", "leader")) => Fault::NatsNodePartition(Side::Leader),
            Some(("nats-node-partition", "follower")) => Fault::NatsNodePartition(Side::Follower),
            _ => match text {
                "kill-worker" => Fault::KillWorker,
                "pause-worker" => Fault::PauseWorker,
                "postgres-restart" => Fault::PostgresRestart,
                "postgres-down" => Fault::PostgresDown,
                "terminate-backends" => Fault::TerminateBackends,
                "pool-exhausted" => Fault::PoolExhausted,
                "nats-restart" => Fault::NatsRestart,
                "nats-node-kill" => Fault::NatsNodeKill,
                "nats-node-freeze" => Fault::NatsNodeFreeze,
                "isolate-worker" => Fault::IsolateWorker,
                "slow-links" => Fault::SlowLinks,
                other => return Err(format!("no fault {other:?}")),
            },
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(service) => write!(f, "{} killed", service.name()),
            Fault::Pause(service) => write!(f, "{} paused {PAUSE:?}", service.name()),
            Fault::KillWorker => write!(f, "worker killed"),
            Fault::PauseWorker => write!(f, "worker paused {PAUSE:?}"),
            Fault::PostgresRestart => write!(f, "PostgreSQL restarted"),
            Fault::PostgresDown => write!(f, "PostgreSQL down {:?}", postgres_down()),
            Fault::TerminateBackends => write!(f, "backends terminated"),
            Fault::PoolExhausted => write!(f, "pools exhausted {:?}", DB_ACQUIRE_TIMEOUT * 2),
            Fault::NatsRestart => write!(f, "NATS cluster killed, restarted"),
            Fault::NatsNodeKill => write!(f, "NATS node killed"),
            Fault::NatsNodeFreeze => write!(f, "NATS node frozen {NODE_FAULT:?}"),
            Fault::NatsNodePartition(side) => {
                write!(f, "NATS {} partitioned {NODE_FAULT:?}", side.name())
            }
            Fault::SlowLinks => write!(
                f,
                "links +{:?}~{:?} {:.0}% loss {SLOW_LINKS:?}",
                SLOW_LINK.delay,
                SLOW_LINK.jitter,
                SLOW_LINK.loss * 100.0
            ),
            Fault::CutFromNats(service) => write!(f, "{} cut from NATS {CUT:?}", service.name()),
            Fault::IsolateWorker => write!(f, "worker isolated {CUT:?}"),
            Fault::PostgresCutFrom(service) => write!(
                f,
                "PostgreSQL cut from {} {:?}",
                service.name(),
                postgres_down()
            ),
        }
    }
}

/// One reading of a process's resources.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// Since the load started.
    pub at: Duration,
    /// Resident memory.
    pub rss_kib: u64,
    /// Open file descriptors (sockets included).
    pub fds: u64,
}

/// What the suite does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Faults in the order injected; the schedule repeats them (reshuffled) until `duration`.
    pub faults: Vec<Fault>,
    /// Passes over `faults` (reshuffled) keep coming until this long after the load started;
    /// there is always one.
    pub duration: Duration,
    /// Steady load between one fault's recovery and the next fault.
    pub fault_gap: Duration,
    /// Scan requests published per second.
    pub rate: f64,
    pub workers: usize,
    pub worker_capacity: u32,
    pub injection: Injection,
    /// Shuffles the schedule and draws the injector's copies.
    pub seed: u64,
    /// After the load stops, how long everything may take to finish.
    pub settle_max: Duration,
    /// Faults left out of `faults` because this machine cannot run them, and why.
    pub left_out: Vec<String>,
}

impl Plan {
    /// Every fault once, in a seeded order, a couple of seconds apart: for CI.
    /// The network faults join them where this machine can make a network of the suite's own
    /// ([`crate::netns`]); the report says when it cannot.
    pub fn bounded(seed: u64) -> Self {
        let mut faults = Fault::all();
        let mut left_out = Vec::new();
        match crate::netns::available() {
            Ok(()) => faults.extend(Fault::network()),
            Err(why) => left_out.push(format!("network faults not run: {why}")),
        }
        if faults.contains(&Fault::SlowLinks)
            && let Err(why) = crate::impair::Impairment::available()
        {
            faults.retain(|fault| *fault != Fault::SlowLinks);
            left_out.push(format!("slow and lossy links not run: {why}"));
        }
        faults.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        Self {
            faults,
            duration: Duration::ZERO,
            fault_gap: Duration::from_secs(2),
            rate: 5.0,
            workers: 3,
            worker_capacity: 4,
            injection: Injection {
                probability: 0.1,
                delay_max: Duration::from_secs(3),
            },
            seed,
            settle_max: Duration::from_secs(120),
            left_out,
        }
    }

    /// Faults every `fault_gap` for `duration`: on demand.
    pub fn soak(seed: u64, duration: Duration, fault_gap: Duration) -> Self {
        Self {
            duration,
            fault_gap,
            ..Self::bounded(seed)
        }
    }
}

/// The child binaries: `test-service` and `test-worker`.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub service: PathBuf,
    pub worker: PathBuf,
}

/// One injected fault and what it looked like.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    /// Since the load started.
    pub at: Duration,
    /// From injection to healed (the process back, the server up).
    pub lasted: Duration,
    /// From healed until the next scan reached a terminal state; `None` if none did within
    /// [`PROGRESS_MAX`].
    pub progress_after: Option<Duration>,
    /// `/readyz` checks seen failing while it lasted, as `service: check`.
    pub readyz_failing: BTreeSet<String>,
    /// The first distinct warnings and errors each process logged while it lasted.
    pub logged: Vec<String>,
}

/// What the suite did and found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub ran: Duration,
    pub attempted: usize,
    pub confirmed: usize,
    pub publish_errors: usize,
    pub scans_by_state: check::StateCounts,
    pub faults: Vec<FaultRecord>,
    pub copies_injected: u64,
    pub messages_seen: u64,
    /// Processes that exited without the suite killing them, restarted as an orchestrator
    /// would.
    pub unexpected_exits: Vec<String>,
    /// Every check that failed.
    pub violations: Vec<String>,
    /// What the suite could not try here, and why.
    pub notes: Vec<String>,
    /// Each process's memory and open files, read between faults.
    pub resources: BTreeMap<String, Vec<Usage>>,
    /// The processes' logs, kept when something failed or on request.
    pub logs: Option<PathBuf>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos: seed {}, ran {:.0?}; {} requests, {} confirmed ({} publish errors); scans {:?}; {} of {} bus messages copied late",
            self.seed,
            self.ran,
            self.attempted,
            self.confirmed,
            self.publish_errors,
            self.scans_by_state,
            self.copies_injected,
            self.messages_seen
        )?;
        writeln!(
            f,
            "{:<28} {:>8} {:>8} {:>10}  /readyz failing",
            "fault", "at", "lasted", "progress"
        )?;
        for record in &self.faults {
            let progress = record
                .progress_after
                .map_or_else(|| "none".to_owned(), |after| format!("{after:.1?}"));
            writeln!(
                f,
                "{:<28} {:>8.1?} {:>8.1?} {:>10}  {}",
                record.fault.to_string(),
                record.at,
                record.lasted,
                progress,
                record
                    .readyz_failing
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
            for line in &record.logged {
                writeln!(f, "    log: {line}")?;
            }
        }
        for exit in &self.unexpected_exits {
            writeln!(f, "unexpected exit: {exit}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if !self.resources.is_empty() {
            writeln!(
                f,
                "{:<12} {:>8} {:>22} {:>16}  RSS MiB at each quarter of the run",
                "process", "readings", "RSS MiB first/last/max", "fds first/last/max"
            )?;
        }
        for (name, readings) in &self.resources {
            let (Some(first), Some(last)) = (readings.first(), readings.last()) else {
                continue;
            };
            let rss_max = readings
                .iter()
                .map(|usage| usage.rss_kib)
                .max()
                .unwrap_or(0);
            let fds_max = readings.iter().map(|usage| usage.fds).max().unwrap_or(0);
            let mib = |kib: u64| kib as f64 / 1024.0;
            // Growth shows between first and last; a creep that levels off, or not, only here.
            let quarters = (0..=4)
                .map(|quarter| {
                    let usage = &readings[(readings.len() - 1) * quarter / 4];
                    format!("{:.0}", mib(usage.rss_kib))
                })
                .collect::<Vec<_>>()
                .join(" ");
            writeln!(
                f,
                "{name:<12} {:>8} {:>22} {:>16}  {quarters}",
                readings.len(),
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    mib(first.rss_kib),
                    mib(last.rss_kib),
                    mib(rss_max)
                ),
                format!("{}/{}/{fds_max}", first.fds, last.fds)
            )?;
        }
        if self.violations.is_empty() {
            writeln!(f, "checker: every invariant holds")?;
        } else {
            for violation in &self.violations {
                writeln!(f, "VIOLATION: {violation}")?;
            }
        }
        if let Some(logs) = &self.logs {
            writeln!(f, "logs: {}", logs.display())?;
        }
        Ok(())
    }
}

/// The running world: servers, processes, and the suite's own connections.
struct World {
    postgres: PostgresServer,
    /// Three nodes; palisade's streams have three replicas.
    nats: NatsCluster,
    /// The suite's own network, when the plan cuts links; every process (each NATS node
    /// too) runs in a host of it, and PostgreSQL listens on an address of its own on it.
    network: Option<Wiring>,
    pool: PgPool,
    bus: Bus,
    services: BTreeMap<Service, Vec<Process>>,
    workers: Vec<Process>,
    sweeps: Sweeps,
    logs: tempfile::TempDir,
    unexpected_exits: Vec<String>,
}

/// The suite's network and PostgreSQL's address on it.
struct Wiring {
    network: Network,
    postgres: Ipv4Addr,
}

/// Runs the plan and checks the result. Panics only when the suite itself cannot run.
pub async fn run(plan: &Plan, binaries: &Binaries, keep_logs: bool) -> Report {
    let mut world = World::start(plan, binaries).await;
    let notes = plan.left_out.clone();
    let organization_id = world.organization_id().await;
    for worker in &mut world.workers {
        worker.start();
    }
    world.wait_ready().await;

    let ledger: SharedLedger = Arc::new(Mutex::new(Ledger::default()));
    let stop_load = CancellationToken::new();
    let load = tokio::spawn(ledger::run_load(
        client::Client::new(world.bus.clone(), ledger::CLIENT_ID),
        organization_id.to_string(),
        plan.rate,
        ledger.clone(),
        stop_load.clone(),
    ));
    let injected = Arc::new(injector::Injected::default());
    let injector = tokio::spawn(injector::run(
        world.bus.clone(),
        plan.injection,
        plan.seed,
        injected.clone(),
        stop_load.clone(),
    ));

    let started = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(plan.seed);
    let mut schedule = plan.faults.clone();
    let mut records: Vec<FaultRecord> = Vec::new();
    let mut resources: BTreeMap<String, Vec<Usage>> = BTreeMap::new();
    let mut stuck = None;
    'schedule: loop {
        for fault in &schedule {
            tokio::time::sleep(plan.fault_gap).await;
            world.restart_exited();
            world.read_usage(started, &mut resources);
            tracing::info!(%fault, "injecting");
            let record = world.inject(*fault, started, &mut rng).await;
            tracing::info!(?record, "fault healed");
            let progressed = record.progress_after.is_some();
            records.push(record);
            if !progressed {
                // Stuck: more faults would only hide where.
                stuck = Some(*fault);
                break 'schedule;
            }
        }
        if started.elapsed() >= plan.duration {
            break;
        }
        schedule.shuffle(&mut rng);
    }
    tokio::time::sleep(plan.fault_gap).await;
    stop_load.cancel();
    // Every publish is bounded by its PubAck timeout; a hang here is the suite's own bug.
    tokio::time::timeout(Duration::from_secs(30), async {
        let _ = load.await;
        let _ = injector.await;
    })
    .await
    .expect("the load and the injector stop within 30 s");
    world.restart_exited();

    let ledger = std::mem::take(&mut *ledger.lock().expect("not poisoned"));
    let settled = world.settle(&ledger, plan.settle_max).await;
    let sweeps = world.sweeps.lock().expect("not poisoned").clone();
    let checked = tokio::time::timeout(
        Duration::from_secs(120),
        check::check(&world.pool, &world.bus, &ledger, &sweeps),
    )
    .await;
    let mut violations = match checked {
        Ok(Ok(violations)) => violations,
        Ok(Err(error)) => vec![format!("the checker could not read the outcome: {error:#}")],
        Err(_) => vec!["the checker did not finish within 120 s".to_owned()],
    };
    if let Some(fault) = stuck {
        violations.push(format!(
            "no scan finished within {PROGRESS_MAX:?} of \"{fault}\" healing; the schedule stopped there"
        ));
    }
    if !settled {
        violations.push(format!(
            "the system did not settle within {:?} of the load stopping",
            plan.settle_max
        ));
    }
    let (_, scans_by_state) = check::unfinished(&world.pool, &ledger)
        .await
        .unwrap_or_default();
    world.stop().await;
    let logs = (keep_logs || !violations.is_empty()).then(|| world.logs.keep());
    Report {
        seed: plan.seed,
        ran: started.elapsed(),
        attempted: ledger.attempted.len(),
        confirmed: ledger.confirmed.len(),
        publish_errors: ledger.errors.len(),
        scans_by_state,
        faults: records,
        copies_injected: injected.copied.load(std::sync::atomic::Ordering::Relaxed),
        messages_seen: injected.seen.load(std::sync::atomic::Ordering::Relaxed),
        unexpected_exits: world.unexpected_exits.clone(),
        violations,
        notes,
        resources,
        logs,
    }
}

impl World {
    async fn start(plan: &Plan, binaries: &Binaries) -> Self {
        let mut network = plan.faults.iter().any(|fault| fault.is_network()).then(|| {
            let mut network = Network::create()
                .unwrap_or_else(|why| panic!("the plan cuts network links, but {why}"));
            Wiring {
                postgres: network.server_address(),
                network,
            }
        });
        let postgres =
            PostgresServer::start_at(network.as_ref().map(|wiring| wiring.postgres)).await;
        // NATS authenticates, as in production: each process on its own credentials.
        let authority = identity::Authority::generate();
        let subjects = Subjects::new("chaos").expect("valid prefix");
        let node_hosts = network.as_mut().map(|wiring| {
            (0..NatsCluster::SIZE)
                .map(|node| wiring.network.host(&format!("nats-n{node}")))
                .collect()
        });
        let nats = NatsCluster::start_secured_in(&authority, &subjects, node_hosts).await;
        let mut common = CommonSettings::from_env().expect("valid environment");
        common.database = store::DatabaseSettings::new(postgres.url("palisade"));
        common.database.max_connections = 4;
        // The suite's own pool waits longer than the services' (`service_env`): its
        // connections must outlast the faults it injects.
        common.database.acquire_timeout = Duration::from_secs(10);
        common.nats_url = nats.urls();
        common.streams.replicas = NatsCluster::SIZE;
        common.subjects = subjects;
        common.nats_credentials = crate::unrestricted_credentials(&authority);
        palisade::system::prepare_database(&common)
            .await
            .expect("the suite's database migrates");
        let connections = Connections::open(&common, &messages::Identity::Operator)
            .await
            .expect("the suite connects");
        let logs = tempfile::Builder::new()
            .prefix("palisade-chaos-")
            .tempdir()
            .expect("a log directory");

        let env = service_env(&common);
        let credentials = |identity: messages::Identity| {
            let path =
                crate::write_credentials(&authority, &common.subjects, &identity, logs.path());
            ("NATS_CREDS".to_owned(), path.display().to_string())
        };
        let sweeps = Sweeps::default();
        let mut services = BTreeMap::new();
        for service in Service::ALL {
            let replicas = if service == Service::Reaper { 2 } else { 1 };
            let processes = (0..replicas)
                .map(|replica| {
                    let name = if replicas > 1 {
                        format!("{}-{replica}", service.name())
                    } else {
                        service.name().to_owned()
                    };
                    let mut env = env.clone();
                    env.push(credentials(messages::Identity::Service(service)));
                    let host = network.as_mut().map(|wiring| wiring.network.host(&name));
                    let mut process =
                        Process::new(name, &binaries.service, &[service.name()], env, logs.path())
                            .in_host(host)
                            .with_http_port(free_port());
                    if service == Service::Reaper {
                        process = process.with_sweeps(replica, sweeps.clone());
                    }
                    process.start();
                    process
                })
                .collect();
            services.insert(service, processes);
        }
        let mut workers = Vec::new();
        for index in 0..plan.workers {
            let worker_id = Uuid::new_v4();
            store::admin::register_worker(
                &connections.pool,
                worker_id,
                "chaos-worker",
                plan.worker_capacity as i32,
            )
            .await
            .expect("worker registered");
            let identity = messages::Identity::Worker { worker_id };
            crate::push_account(&authority, &common.subjects, &common.nats_url, &identity).await;
            let mut env = env.clone();
            env.extend([
                ("PALISADE_WORKER_ID".to_owned(), worker_id.to_string()),
                (
                    "PALISADE_WORKER_CAPACITY".to_owned(),
                    plan.worker_capacity.to_string(),
                ),
                credentials(identity),
            ]);
            let name = format!("worker-{index}");
            let host = network.as_mut().map(|wiring| wiring.network.host(&name));
            workers.push(Process::new(name, &binaries.worker, &[], env, logs.path()).in_host(host));
        }
        Self {
            postgres,
            nats,
            network,
            pool: connections.pool,
            bus: connections.bus,
            services,
            workers,
            sweeps,
            logs,
            unexpected_exits: Vec::new(),
        }
    }

    /// The load's organization, served by every worker.
    async fn organization_id(&self) -> Uuid {
        let id = Uuid::now_v7();
        store::admin::create_organization(&self.pool, id, "chaos", None)
            .await
            .expect("organization created");
        let worker_ids: Vec<(Uuid,)> = sqlx::query_as("SELECT id FROM workers")
            .fetch_all(&self.pool)
            .await
            .expect("workers read");
        for (worker_id,) in worker_ids {
            store::admin::assign_worker(
                &self.pool,
                id,
                worker_id,
                &store::audit::Change::new("test", ""),
            )
            .await
            .expect("worker assigned");
        }
        id
    }

    fn processes(&mut self) -> impl Iterator<Item = &mut Process> {
        self.services
            .values_mut()
            .flatten()
            .chain(self.workers.iter_mut())
    }

    /// Waits until every service's `/readyz` says ready.
    async fn wait_ready(&self) {
        let ports: Vec<(String, SocketAddr)> = self.readyz_ports();
        let deadline = Instant::now() + crate::WAIT_MAX * 3;
        loop {
            let mut failing = BTreeSet::new();
            for (name, port) in &ports {
                if !ready(*port).await.is_empty_and_answered() {
                    failing.insert(name.clone());
                }
            }
            if failing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "services not ready: {failing:?}; logs in {}",
                self.logs.path().display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn readyz_ports(&self) -> Vec<(String, SocketAddr)> {
        self.services
            .values()
            .flatten()
            .filter_map(|process| Some((process.name.clone(), process.http_addr?)))
            .collect()
    }

    /// Adds a reading of every running process's memory and open files.
    fn read_usage(&mut self, started: Instant, resources: &mut BTreeMap<String, Vec<Usage>>) {
        let at = started.elapsed();
        let nodes: Vec<(String, Option<u32>)> = (0..NatsCluster::SIZE)
            .map(|node| {
                (
                    format!("nats-{}", self.nats.name(node)),
                    self.nats.pid(node),
                )
            })
            .collect();
        let processes = self
            .processes()
            .map(|process| (process.name.clone(), process.pid()));
        for (name, pid) in processes.chain(nodes) {
            if let Some((rss_kib, fds)) = pid.and_then(processes::usage) {
                resources
                    .entry(name)
                    .or_default()
                    .push(Usage { at, rss_kib, fds });
            }
        }
    }

    /// Starts again, as an orchestrator would, any process that exited on its own; notes it.
    fn restart_exited(&mut self) {
        let mut exits = Vec::new();
        for process in self.processes() {
            if let Some(status) = process.exited() {
                exits.push(format!("{} ({status})", process.name));
                // The child is reaped: drop it and start afresh.
                process.forget();
                process.start();
            }
        }
        self.unexpected_exits.extend(exits);
    }

    async fn inject(
        &mut self,
        fault: Fault,
        started: Instant,
        rng: &mut rand::rngs::StdRng,
    ) -> FaultRecord {
        let at = started.elapsed();
        let log_offsets = self.log_offsets();
        let sampling = CancellationToken::new();
        let sampler = tokio::spawn(sample_readyz(self.readyz_ports(), sampling.clone()));
        let injected = Instant::now();
        match fault {
            Fault::Kill(service) => {
                let replicas = self.services.get_mut(&service).expect("every service runs");
                let replica = rng.random_range(0..replicas.len());
                replicas[replica].kill().await;
                tokio::time::sleep(RESTART_AFTER).await;
                replicas[replica].start();
            }
            Fault::Pause(service) => {
                let process = &mut self.services.get_mut(&service).expect("every service runs")[0];
                process.pause();
                tokio::time::sleep(PAUSE).await;
                process.resume();
            }
            Fault::KillWorker => {
                let index = rng.random_range(0..self.workers.len());
                self.workers[index].kill().await;
                tokio::time::sleep(RESTART_AFTER).await;
                self.workers[index].start();
            }
            Fault::PauseWorker => {
                let index = rng.random_range(0..self.workers.len());
                self.workers[index].pause();
                tokio::time::sleep(PAUSE).await;
                self.workers[index].resume();
            }
            Fault::PostgresRestart => {
                self.postgres.stop().await;
                self.postgres.restart().await;
            }
            Fault::PostgresDown => {
                self.postgres.stop().await;
                tokio::time::sleep(postgres_down()).await;
                self.postgres.restart().await;
            }
            Fault::TerminateBackends => {
                let terminated = sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .execute(&self.pool)
                .await;
                if let Err(error) = terminated {
                    tracing::warn!(%error, "could not terminate backends");
                }
            }
            Fault::PoolExhausted => {
                let locked = async {
                    // A connection the last PostgreSQL fault broke fails once: take another.
                    let mut transaction = match self.pool.begin().await {
                        Ok(transaction) => transaction,
                        Err(_) => self.pool.begin().await?,
                    };
                    sqlx::query("LOCK TABLE scans, worker_tasks IN ACCESS EXCLUSIVE MODE")
                        .execute(&mut *transaction)
                        .await?;
                    tokio::time::sleep(DB_ACQUIRE_TIMEOUT * 2).await;
                    transaction.rollback().await
                };
                if let Err(error) = locked.await {
                    tracing::warn!(%error, "could not hold the lock");
                }
            }
            Fault::NatsRestart => self.nats.kill_all_and_restart(RESTART_AFTER).await,
            Fault::NatsNodeKill => {
                let node = rng.random_range(0..NatsCluster::SIZE);
                self.nats.kill(node).await;
                tokio::time::sleep(RESTART_AFTER).await;
                self.nats.restart(node).await;
            }
            Fault::NatsNodeFreeze => {
                let node = rng.random_range(0..NatsCluster::SIZE);
                self.nats.pause(node);
                tokio::time::sleep(NODE_FAULT).await;
                self.nats.resume(node).await;
            }
            Fault::CutFromNats(_)
            | Fault::IsolateWorker
            | Fault::PostgresCutFrom(_)
            | Fault::NatsNodePartition(_)
            | Fault::SlowLinks => {
                self.cut(fault, rng).await;
            }
        }
        let lasted = injected.elapsed();
        let progress_after = self.progress_after().await;
        sampling.cancel();
        let readyz_failing = sampler.await.unwrap_or_default();
        let logged = self.logged_since(&log_offsets);
        FaultRecord {
            fault,
            at,
            lasted,
            progress_after,
            readyz_failing,
            logged,
        }
    }

    /// A network fault: a link cut, then healed.
    async fn cut(&mut self, fault: Fault, rng: &mut rand::rngs::StdRng) {
        let wiring = self
            .network
            .as_ref()
            .expect("a plan with network faults has a network");
        let host_of = |process: &Process| {
            process
                .host()
                .cloned()
                .expect("every process runs in a host of the network")
        };
        match fault {
            Fault::CutFromNats(service) => {
                let host = host_of(&self.services[&service][0]);
                let nodes = self.node_addresses();
                for node in &nodes {
                    wiring.network.cut(&host, *node);
                }
                tokio::time::sleep(CUT).await;
                for node in &nodes {
                    wiring.network.heal(&host, *node);
                }
            }
            Fault::NatsNodePartition(side) => {
                let cut = self.node_on(side, rng).await;
                let links = self.links_between(cut);
                for (host, peer) in &links {
                    wiring.network.cut(host, *peer);
                }
                tokio::time::sleep(NODE_FAULT).await;
                for (host, peer) in &links {
                    wiring.network.heal(host, *peer);
                }
                self.nats.wait_healthy(cut).await;
            }
            Fault::SlowLinks => {
                let impairment = crate::impair::Impairment::start(&wiring.network, SLOW_LINK)
                    .unwrap_or_else(|why| panic!("the plan slows links, but {why}"));
                tokio::time::sleep(SLOW_LINKS).await;
                let (seen, dropped) = impairment.counts();
                drop(impairment);
                tracing::info!(seen, dropped, "links healed");
            }
            Fault::IsolateWorker => {
                let host = host_of(&self.workers[rng.random_range(0..self.workers.len())]);
                wiring.network.isolate(&host);
                tokio::time::sleep(CUT).await;
                wiring.network.rejoin(&host);
            }
            Fault::PostgresCutFrom(service) => {
                let hosts: Vec<_> = self.services[&service].iter().map(host_of).collect();
                for host in &hosts {
                    wiring.network.cut(host, wiring.postgres);
                }
                tokio::time::sleep(postgres_down()).await;
                for host in &hosts {
                    wiring.network.heal(host, wiring.postgres);
                }
            }
            other => unreachable!("{other} cuts no link"),
        }
    }

    /// Each NATS node's address on the suite's network.
    fn node_addresses(&self) -> Vec<Ipv4Addr> {
        (0..NatsCluster::SIZE)
            .map(|node| self.node_host(node).address)
            .collect()
    }

    fn node_host(&self, node: usize) -> crate::netns::Host {
        self.nats
            .host(node)
            .cloned()
            .expect("on the suite's network every node runs in a host")
    }

    /// Both directions of every link between node `cut` and its peers, as (host, the address
    /// it must no longer reach).
    fn links_between(&self, cut: usize) -> Vec<(crate::netns::Host, Ipv4Addr)> {
        let cut_host = self.node_host(cut);
        (0..NatsCluster::SIZE)
            .filter(|peer| *peer != cut)
            .flat_map(|peer| {
                let peer_host = self.node_host(peer);
                [
                    (cut_host.clone(), peer_host.address),
                    (peer_host, cut_host.address),
                ]
            })
            .collect()
    }

    /// The node leading the requests stream ([`Side::Leader`]) or one of the others.
    async fn node_on(&self, side: Side, rng: &mut rand::rngs::StdRng) -> usize {
        let stream = self.bus.subjects().requests_stream();
        let leader = async {
            let stream = self.bus.jetstream().get_stream(&stream).await.ok()?;
            stream.cached_info().cluster.clone()?.leader
        };
        let leader = tokio::time::timeout(Duration::from_secs(5), leader)
            .await
            .ok()
            .flatten()
            .and_then(|name| self.nats.node_named(&name));
        let random = rng.random_range(0..NatsCluster::SIZE);
        match (side, leader) {
            (Side::Leader, Some(leader)) => leader,
            (Side::Follower, Some(leader)) => (leader + 1 + random % 2) % NatsCluster::SIZE,
            // No leader known (an election under way): any node.
            (_, None) => random,
        }
    }

    /// How long until one more scan of the load reaches a terminal state. A process that exits
    /// meanwhile is started again at once, as an orchestrator would.
    async fn progress_after(&mut self) -> Option<Duration> {
        let healed = Instant::now();
        let mut before = None;
        while healed.elapsed() < PROGRESS_MAX {
            self.restart_exited();
            if let Ok((terminal,)) =
                sqlx::query_as::<_, (i64,)>("SELECT count(*) FROM scans WHERE NOT state = ANY($1)")
                    .bind(
                        store::states::ScanState::ACTIVE
                            .iter()
                            .map(|state| state.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .fetch_one(&self.pool)
                    .await
            {
                match before {
                    None => before = Some(terminal),
                    Some(before) if terminal > before => return Some(healed.elapsed()),
                    Some(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    fn log_offsets(&mut self) -> Vec<(String, PathBuf, u64)> {
        self.processes()
            .map(|process| {
                let path = process.log_path().to_owned();
                let length = std::fs::metadata(&path).map_or(0, |meta| meta.len());
                (process.name.clone(), path, length)
            })
            .collect()
    }

    /// The first two distinct warnings or errors each process logged since `offsets`.
    fn logged_since(&self, offsets: &[(String, PathBuf, u64)]) -> Vec<String> {
        let mut logged = Vec::new();
        for (name, path, offset) in offsets {
            let Ok(text) = read_from(path, *offset) else {
                continue;
            };
            let mut seen = BTreeSet::new();
            for line in text.lines() {
                let Some(message) = log_message(line) else {
                    continue;
                };
                if seen.len() < 2 && seen.insert(message.clone()) {
                    logged.push(format!("{name}: {message}"));
                }
            }
        }
        logged
    }

    /// Waits until every confirmed request's scan is terminal and the outbox is empty.
    async fn settle(&self, ledger: &Ledger, settle_max: Duration) -> bool {
        let deadline = Instant::now() + settle_max;
        while Instant::now() < deadline {
            let unfinished = check::unfinished(&self.pool, ledger).await;
            let backlog = store::outbox::backlog(&self.pool).await;
            if let (Ok((unfinished, _)), Ok((0, _))) = (unfinished, backlog)
                && unfinished.is_empty()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    async fn stop(&mut self) {
        let processes: Vec<&mut Process> = self.processes().collect();
        futures::future::join_all(
            processes
                .into_iter()
                .map(|process| process.stop(Duration::from_secs(10))),
        )
        .await;
    }
}

/// Every setting the suite's processes share: the suite's servers and its short timing.
fn service_env(common: &CommonSettings) -> Vec<(String, String)> {
    let millis = |duration: Duration| duration.as_millis().to_string();
    [
        ("DATABASE_URL", common.database.url.clone()),
        ("NATS_URL", common.nats_url.clone()),
        (
            "PALISADE_SUBJECT_PREFIX",
            common.subjects.prefix().to_owned(),
        ),
        (
            "PALISADE_STREAM_REPLICAS",
            common.streams.replicas.to_string(),
        ),
        ("PALISADE_DB_MAX_CONNECTIONS", "4".to_owned()),
        ("PALISADE_DB_ACQUIRE_TIMEOUT_MS", millis(DB_ACQUIRE_TIMEOUT)),
        ("PALISADE_LEASE_TTL_MS", millis(LEASE_TTL)),
        ("PALISADE_RENEW_INTERVAL_MS", millis(LEASE_TTL / 4)),
        ("PALISADE_ADMISSION_ACK_WAIT_MS", millis(ACK_WAIT)),
        ("PALISADE_INGESTION_ACK_WAIT_MS", millis(ACK_WAIT)),
        ("PALISADE_ADMISSION_MAX_DELIVER", MAX_DELIVER.to_string()),
        ("PALISADE_INGESTION_MAX_DELIVER", MAX_DELIVER.to_string()),
        ("PALISADE_RETRY_BASE_MS", "100".to_owned()),
        ("PALISADE_RETRY_CAP_MS", "1000".to_owned()),
        ("PALISADE_MAX_ATTEMPTS", "50".to_owned()),
        ("PALISADE_BATCH_FINDINGS_MAX", "10".to_owned()),
        ("PALISADE_ACQUIRE_POLL_MS", "200".to_owned()),
        ("PALISADE_DISPATCH_HEARTBEAT_MS", "500".to_owned()),
        ("PALISADE_REAPER_INTERVAL_MS", "200".to_owned()),
        ("PALISADE_REAPER_LEASE_TTL_MS", "2000".to_owned()),
        ("PALISADE_REAPER_LEASE_RETRY_MS", "300".to_owned()),
        ("PALISADE_ENRICHMENT_POLL_MS", "200".to_owned()),
        (
            "RUST_LOG",
            std::env::var("CHAOS_LOG").unwrap_or_else(|_| "warn".to_owned()),
        ),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect()
}

/// A `/readyz` answer: its status (0 when nothing answered) and failing check names.
struct Readiness {
    status: u16,
    failing: Vec<String>,
}

impl Readiness {
    fn is_empty_and_answered(&self) -> bool {
        self.status == 200 && self.failing.is_empty()
    }
}

async fn ready(addr: SocketAddr) -> Readiness {
    let url = format!("http://{addr}/readyz");
    match tokio::time::timeout(Duration::from_secs(2), palisade::probe::probe(&url)).await {
        Ok(Ok(answer)) => {
            let failing = serde_json::from_str::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|body| body["checks"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter(|check| check["state"] != "ok")
                .filter_map(|check| check["name"].as_str().map(str::to_owned))
                .collect();
            Readiness {
                status: answer.status,
                failing,
            }
        }
        _ => Readiness {
            status: 0,
            failing: vec!["no answer".to_owned()],
        },
    }
}

/// Polls every `/readyz` until `stop`; returns every `service: check` seen failing.
async fn sample_readyz(
    ports: Vec<(String, SocketAddr)>,
    stop: CancellationToken,
) -> BTreeSet<String> {
    let mut failing = BTreeSet::new();
    while !stop.is_cancelled() {
        for (name, port) in &ports {
            for check in ready(*port).await.failing {
                failing.insert(format!("{name}: {check}"));
            }
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    failing
}

fn read_from(path: &Path, offset: u64) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    file.seek(std::io::SeekFrom::Start(offset))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

/// The level and message of a WARN or ERROR line of `tracing_subscriber::fmt`, without its
/// timestamp, shortened.
fn log_message(line: &str) -> Option<String> {
    let start = line.find(" WARN ").or_else(|| line.find(" ERROR "))?;
    let message: String = line[start + 1..].chars().take(200).collect();
    Some(message)
}
