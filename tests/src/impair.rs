//! Delay and loss on the suite's private network ([`crate::netns`]) without the kernel's
//! `netem`, which some kernels (this machine's among them) are built without: iptables rules
//! hand every IPv4 packet that crosses a network's bridge to a netfilter queue (NFQUEUE), and a
//! thread of this process holds each one in userspace for the delay, then gives the kernel its
//! verdict: accepted, or dropped with the loss's probability. A userspace netem, for delay,
//! jitter and loss: each packet is held the delay and a random part of the jitter, so packets
//! closer together than the jitter may leave out of the order they came (reordering).
//!
//! The packets: a host's to a server address (iptables `INPUT -i <bridge>`), a server
//! address's to a host (`OUTPUT -o <bridge>`), and a host's to another host, which the bridge
//! forwards (`FORWARD`, bridged, from and to the bridge). A round trip crosses the bridge twice,
//! so it takes two delays more. ARP and IPv6 pass untouched. The rules name the bridge, so no
//! other packet is queued: not loopback's (the machine's shared servers), nor another suite's
//! network's.
//!
//! Bridged packets reach iptables only with `net.bridge.bridge-nf-call-iptables` at 1, which
//! [`Impairment::start`] sets if it is not. It is a setting of this process's network namespace
//! (the root one, where the bridges are), not of the hosts'; the kernel's default is already 1
//! once bridge netfilter is loaded, and it only lets iptables see bridged IPv4 packets, which
//! its chains accept unless a rule says otherwise: it is left as it is after.
//!
//! Needs `iptables-legacy` (Debian's `iptables` package, which .ci/run installs: this kernel's
//! nftables cannot queue, no `CONFIG_NFT_QUEUE`), the kernel's NFQUEUE, physdev and bridge
//! netfilter, and `CAP_NET_ADMIN`; [`Impairment::available`] says which is missing.
//!
//! Failing safe: the rules pass packets on when no listener is bound (`--queue-bypass`: the
//! listener's thread ended, or the process died before removing them), and the kernel passes
//! packets on rather than drop them when the listener falls behind (the queue fails open).
//! Dropping an [`Impairment`] removes its rules, also while a panicking test unwinds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::Rng as _;

use crate::netns::{Network, Unavailable};

const IPTABLES: &str = "iptables-legacy";
const BRIDGE_NF_CALL_IPTABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";
/// The queue numbers tried, at random (another one when taken): far from the low numbers a
/// machine's own queues use.
const QUEUE_NUMBERS: std::ops::Range<u16> = 40_000..65_000;
const QUEUE_TRIES: usize = 16;
/// Packets the kernel holds for the listener at most (its default, 1024, is 200 ms of 5,000
/// packets a second); past it, packets pass undelayed.
const QUEUE_MAX_LEN: u32 = 65_536;
/// How long the listener sleeps when no packet came and none is due.
const IDLE: Duration = Duration::from_millis(1);
/// Packets read at most before the held ones are looked at again.
const BATCH: usize = 256;

/// Delay and loss on every packet crossing a network's bridge, until dropped.
pub struct Impairment {
    /// Removed first on drop, so that no packet is queued once the listener stops.
    rules: Option<Rules>,
    stop: Arc<AtomicBool>,
    listener: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    seen: AtomicU64,
    dropped: AtomicU64,
}

/// The packets held, the soonest due first.
type Held = BinaryHeap<Reverse<HeldPacket>>;

/// A packet held: when it is due, and its place in the order packets came (which breaks ties,
/// so packets due at once leave as they came).
struct HeldPacket {
    due: Instant,
    arrival: u64,
    message: nfq::Message,
}

impl PartialEq for HeldPacket {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.arrival) == (other.due, other.arrival)
    }
}

impl Eq for HeldPacket {}

impl PartialOrd for HeldPacket {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HeldPacket {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.arrival).cmp(&(other.due, other.arrival))
    }
}

/// What an impairment does to each packet.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Held at least this long…
    pub delay: Duration,
    /// …and a random part of this besides (reordering packets closer than it)…
    pub jitter: Duration,
    /// …then dropped with this probability (0 to 1).
    pub loss: f64,
}

impl Link {
    /// How long one packet is held.
    fn hold(&self, rng: &mut impl rand::Rng) -> Duration {
        self.delay + self.jitter.mul_f64(rng.random::<f64>())
    }
}

impl Impairment {
    /// Why this machine cannot impair links, if it cannot: it opens a queue and adds (and
    /// removes) a rule like [`Impairment::start`]'s. Changes nothing.
    pub fn available() -> Result<(), Unavailable> {
        bridge_netfilter_setting()?;
        let (_queue, number) = open_queue()?;
        let chain = format!("impair-probe-{:08x}", rand::random::<u32>());
        iptables(&["-N", &chain]).map_err(Unavailable)?;
        let rule = iptables(&[
            "-A",
            &chain,
            "-m",
            "physdev",
            "--physdev-is-bridged",
            "-j",
            "NFQUEUE",
            "--queue-num",
            &number.to_string(),
            "--queue-bypass",
        ]);
        let _ = iptables(&["-F", &chain]);
        let _ = iptables(&["-X", &chain]);
        rule.map_err(|error| {
            Unavailable(format!(
                "iptables cannot queue bridged packets here ({error}): the kernel needs \
                 CONFIG_NETFILTER_XT_TARGET_NFQUEUE and CONFIG_NETFILTER_XT_MATCH_PHYSDEV"
            ))
        })
    }

    /// Every packet that crosses `network`'s bridge (a host's to or from a server address,
    /// and between two hosts) impaired as `link` says (held a millisecond or two more: the
    /// listener looks for due packets every millisecond). One impairment per network at a
    /// time.
    pub fn start(network: &Network, link: Link) -> Result<Self, Unavailable> {
        assert!(
            (0.0..=1.0).contains(&link.loss),
            "loss is a probability, from 0 to 1, not {}",
            link.loss
        );
        let bridge = network.bridge();
        if bridge_netfilter_setting()?.trim() != "1" {
            std::fs::write(BRIDGE_NF_CALL_IPTABLES, "1").map_err(|error| {
                Unavailable(format!(
                    "cannot set {BRIDGE_NF_CALL_IPTABLES} to 1 ({error}), so packets between \
                     two hosts would pass unimpaired: run as root"
                ))
            })?;
        }
        let (queue, number) = open_queue()?;
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let listener = std::thread::Builder::new()
            .name(format!("impair-{bridge}"))
            .spawn({
                let (counts, stop) = (counts.clone(), stop.clone());
                move || listen(queue, link, &stop, &counts)
            })
            .map_err(|error| Unavailable(format!("cannot start the listener: {error}")))?;
        let mut impairment = Self {
            rules: None,
            stop,
            listener: Some(listener),
            counts,
        };
        // On an error, dropping `impairment` stops the listener.
        let rules = Rules::install(&bridge, number).map_err(Unavailable)?;
        impairment.rules = Some(rules);
        Ok(impairment)
    }

    /// Packets seen, and dropped of them, so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counts.seen.load(Ordering::Relaxed),
            self.counts.dropped.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Impairment {
    fn drop(&mut self) {
        drop(self.rules.take());
        self.stop.store(true, Ordering::Relaxed);
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
    }
}

/// `bridge-nf-call-iptables`' value, or why there is none.
fn bridge_netfilter_setting() -> Result<String, Unavailable> {
    std::fs::read_to_string(BRIDGE_NF_CALL_IPTABLES).map_err(|error| {
        Unavailable(format!(
            "no bridge netfilter ({BRIDGE_NF_CALL_IPTABLES}: {error}), so packets between two \
             hosts cannot be impaired: the kernel needs CONFIG_BRIDGE_NETFILTER (or `modprobe \
             br_netfilter`)"
        ))
    })
}

/// Runs `iptables-legacy` with `args`, waiting for another's changes to end; its error
/// output when it fails.
fn iptables(args: &[&str]) -> Result<(), String> {
    let output = Command::new(IPTABLES)
        .args(["-w", "5"])
        .args(args)
        .output()
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => format!(
                "`{IPTABLES}` is not installed: install Debian's `iptables` package \
                 (`apt-get install iptables`, as .ci/run does)"
            ),
            _ => format!("cannot run `{IPTABLES}`: {error}"),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{IPTABLES} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A netfilter queue of this process's, bound to a free number (returned), copying packets'
/// metadata only, long, failing open, and not blocking.
fn open_queue() -> Result<(nfq::Queue, u16), Unavailable> {
    let unavailable = |what: &str, error: std::io::Error| {
        Unavailable(format!(
            "cannot {what} a netfilter queue ({error}): the kernel needs \
             CONFIG_NETFILTER_NETLINK_QUEUE, and this process CAP_NET_ADMIN"
        ))
    };
    let mut queue = nfq::Queue::open().map_err(|error| unavailable("open", error))?;
    let mut tries = 1;
    let number = loop {
        let number = rand::random_range(QUEUE_NUMBERS);
        match queue.bind(number) {
            Ok(()) => break number,
            Err(error) if error.kind() == std::io::ErrorKind::ResourceBusy => {
                if tries == QUEUE_TRIES {
                    return Err(unavailable("bind (all numbers tried were taken)", error));
                }
                tries += 1;
            }
            Err(error) => return Err(unavailable("bind", error)),
        }
    };
    queue
        .set_copy_range(number, 0)
        .and_then(|()| queue.set_queue_max_len(number, QUEUE_MAX_LEN))
        .and_then(|()| queue.set_fail_open(number, true))
        .map_err(|error| unavailable("configure", error))?;
    queue.set_nonblocking(true);
    Ok((queue, number))
}

/// Holds each packet of `queue` as `link` says, then accepts it or drops it (with the link's
/// loss), until `stop`; then accepts those still held.
fn listen(mut queue: nfq::Queue, link: Link, stop: &AtomicBool, counts: &Counts) {
    let mut held = Held::new();
    let mut rng = rand::rng();
    let mut failed = None;
    while !stop.load(Ordering::Relaxed) && failed.is_none() {
        let received = receive(&mut queue, &mut held, || link.hold(&mut rng), counts);
        let now = Instant::now();
        let released = release(
            &mut queue,
            &mut held,
            now,
            |_| rng.random_bool(link.loss),
            counts,
        );
        match (received, released) {
            (Ok(0), Ok(0)) => std::thread::sleep(IDLE),
            (Ok(_), Ok(_)) => {}
            (Err(error), _) | (_, Err(error)) => failed = Some(error),
        }
    }
    let last = receive(&mut queue, &mut held, || Duration::ZERO, counts);
    let due = held
        .iter()
        .map(|Reverse(packet)| packet.due)
        .max()
        .unwrap_or_else(Instant::now);
    let flushed = release(&mut queue, &mut held, due, |_| false, counts);
    if let Some(error) = failed.or(last.err()).or(flushed.err()) {
        eprintln!(
            "impairment: the listener stopped on an error ({error}); packets pass unimpaired \
             until its rules are removed"
        );
    }
}

/// Reads the packets waiting (a batch at most) into `held`, each due as long from now as
/// `hold` says; how many.
fn receive(
    queue: &mut nfq::Queue,
    held: &mut Held,
    mut hold: impl FnMut() -> Duration,
    counts: &Counts,
) -> std::io::Result<usize> {
    for received in 0..BATCH {
        match queue.recv() {
            Ok(message) => {
                let arrival = counts.seen.fetch_add(1, Ordering::Relaxed);
                held.push(Reverse(HeldPacket {
                    due: Instant::now() + hold(),
                    arrival,
                    message,
                }));
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(received),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(BATCH)
}

/// Gives the packets due by `now` their verdict, soonest due first: dropped when `drop` says
/// so, else accepted; how many.
fn release(
    queue: &mut nfq::Queue,
    held: &mut Held,
    now: Instant,
    mut drop: impl FnMut(&nfq::Message) -> bool,
    counts: &Counts,
) -> std::io::Result<usize> {
    let mut released = 0;
    while held.peek().is_some_and(|Reverse(packet)| packet.due <= now) {
        let Some(Reverse(HeldPacket { mut message, .. })) = held.pop() else {
            break;
        };
        let verdict = if drop(&message) {
            counts.dropped.fetch_add(1, Ordering::Relaxed);
            nfq::Verdict::Drop
        } else {
            nfq::Verdict::Accept
        };
        message.set_verdict(verdict);
        queue.verdict(message)?;
        released += 1;
    }
    Ok(released)
}

/// An impairment's chain (`impair-<bridge>`, queueing to its listener) and the jumps to it
/// added so far, removed on drop.
struct Rules {
    chain: String,
    jumps: Vec<Vec<String>>,
}

impl Rules {
    fn install(bridge: &str, queue: u16) -> Result<Self, String> {
        let chain = format!("impair-{bridge}");
        iptables(&["-N", &chain]).map_err(|error| {
            if error.contains("exists") {
                format!("{bridge} is impaired already, one impairment at a time ({error})")
            } else {
                lacking(&error)
            }
        })?;
        let mut rules = Self {
            chain,
            jumps: Vec::new(),
        };
        let queue = queue.to_string();
        let target = ["-j", "NFQUEUE", "--queue-num", &queue, "--queue-bypass"];
        iptables(&[&["-A", &rules.chain][..], &target].concat())
            .map_err(|error| lacking(&error))?;
        for jump in [
            vec!["INPUT", "-i", bridge],
            vec!["OUTPUT", "-o", bridge],
            vec![
                "FORWARD",
                "-i",
                bridge,
                "-o",
                bridge,
                "-m",
                "physdev",
                "--physdev-is-bridged",
            ],
        ] {
            let jump: Vec<String> = (jump.into_iter().chain(["-j", &rules.chain]))
                .map(str::to_owned)
                .collect();
            iptables(&[&["-I"][..], &arguments(&jump)].concat())
                .map_err(|error| lacking(&error))?;
            rules.jumps.push(jump);
        }
        Ok(rules)
    }
}

/// `error`, and where to look for its cause.
fn lacking(error: &str) -> String {
    format!("cannot queue packets ({error}): `Impairment::available` says what this machine lacks")
}

fn arguments(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}

impl Drop for Rules {
    fn drop(&mut self) {
        for jump in self.jumps.iter().rev() {
            if let Err(error) = iptables(&[&["-D"][..], &arguments(jump)].concat()) {
                eprintln!("impairment: {error}");
            }
        }
        for command in ["-F", "-X"] {
            if let Err(error) = iptables(&[command, &self.chain]) {
                eprintln!("impairment: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::{Ipv4Addr, TcpListener, UdpSocket};
    use std::process::{Child, ChildStdin, ChildStdout, Stdio};

    use super::*;
    use crate::netns::{self, Host};

    /// `serve`: echoes every connection on a port of its own, which it prints, until its input
    /// ends. `client ADDRESS PORT`: connects, says so, then for each number read makes that
    /// many one-byte round trips and prints their times in seconds; closes the connection, and
    /// waits for the server to close its side, once its input ends. `datagrams ADDRESS PORT
    /// COUNT`: sends COUNT UDP datagrams numbered from 0, a millisecond apart, and says so.
    const ECHO: &str = r#"
import socket, sys, threading, time

def echo(connection):
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := connection.recv(4096):
        connection.sendall(data)

def serve():
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    threading.Thread(target=accept, args=(listener,), daemon=True).start()
    sys.stdin.read()

def accept(listener):
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=echo, args=(connection,), daemon=True).start()

def client(address, port):
    connection = socket.create_connection((address, int(port)), timeout=60)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print("connected", flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            start = time.monotonic()
            connection.sendall(b"x")
            if connection.recv(1) != b"x":
                sys.exit("the echo server closed the connection")
            times.append(time.monotonic() - start)
        print(" ".join(f"{t:.6f}" for t in times), flush=True)
    connection.shutdown(socket.SHUT_WR)
    connection.recv(1)

def datagrams(address, port, count):
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for number in range(int(count)):
        sender.sendto(str(number).encode(), (address, int(port)))
        time.sleep(0.001)
    print("sent", flush=True)

if sys.argv[1] == "serve":
    serve()
elif sys.argv[1] == "datagrams":
    datagrams(*sys.argv[2:])
else:
    client(*sys.argv[2:])
"#;

    /// `ECHO` running with `args`, in a host or here; killed on drop.
    struct Script {
        child: Child,
        /// Closed to end the script.
        input: Option<ChildStdin>,
        output: BufReader<ChildStdout>,
    }

    impl Script {
        fn start(host: Option<&Host>, args: &[&str]) -> Self {
            let mut args: Vec<String> = ["-c", ECHO]
                .into_iter()
                .chain(args.iter().copied())
                .map(str::to_owned)
                .collect();
            let mut program = "python3".to_owned();
            if let Some(host) = host {
                (program, args) = host.wrap(std::path::Path::new("python3"), &args);
            }
            let mut child = Command::new(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("python3 runs (the test's echo server and client)");
            let input = child.stdin.take();
            let output = BufReader::new(child.stdout.take().unwrap());
            Self {
                child,
                input,
                output,
            }
        }

        fn line(&mut self) -> String {
            let mut line = String::new();
            self.output.read_line(&mut line).expect("reads");
            assert!(
                !line.is_empty(),
                "the echo script ended early (its error above)"
            );
            line.trim().to_owned()
        }
    }

    /// Ends the script by closing its input, so that its connections close while the network
    /// is up (a connection left to close after the namespace is gone keeps it a few minutes);
    /// kills it if it does not end in time.
    impl Drop for Script {
        fn drop(&mut self) {
            drop(self.input.take());
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Echoes every connection on `listener`, in threads of its own.
    fn echo(listener: TcpListener) -> u16 {
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let _ = stream.set_nodelay(true);
                    let _ = std::io::copy(&mut &stream, &mut &stream);
                });
            }
        });
        port
    }

    /// A connection to an echo server, kept open through every phase of the test.
    struct Client(Script);

    impl Client {
        fn connect(host: Option<&Host>, address: Ipv4Addr, port: u16) -> Self {
            let mut script =
                Script::start(host, &["client", &address.to_string(), &port.to_string()]);
            assert_eq!(script.line(), "connected");
            Self(script)
        }

        /// The times of `count` one-byte round trips.
        fn round_trips(&mut self, count: usize) -> Vec<Duration> {
            let input = self.0.input.as_mut().expect("open");
            writeln!(input, "{count}").expect("writes");
            let times: Vec<Duration> = (self.0.line().split(' '))
                .map(|time| Duration::from_secs_f64(time.parse().expect("a time")))
                .collect();
            assert_eq!(times.len(), count, "every round trip made");
            times
        }

        /// The median of five round trips.
        fn median(&mut self) -> Duration {
            let mut times = self.round_trips(5);
            times.sort();
            times[2]
        }
    }

    /// Each client's median round trip, printed under `phase`.
    fn medians(clients: &mut [(&str, Client)], phase: &str) -> Vec<Duration> {
        clients
            .iter_mut()
            .map(|(name, client)| {
                let median = client.median();
                eprintln!("{phase}: {name}: median round trip {median:?}");
                median
            })
            .collect()
    }

    fn chain_left(network: &Network) -> bool {
        let output = Command::new(IPTABLES)
            .args(["-w", "5", "-S"])
            .output()
            .expect("runs");
        String::from_utf8_lossy(&output.stdout).contains(&format!("impair-{}", network.bridge()))
    }

    /// A host's round trips to a server address and to another host take two delays more
    /// while impaired, and as little as before once the impairment is dropped; loopback's
    /// are never delayed. With a fifth of the packets lost, TCP still delivers (with half, its
    /// retransmissions back off so far that a round trip took 35 s, and one over a minute).
    /// With jitter, datagrams sent closer together than it arrive out of order, all of them.
    #[test]
    fn delays_and_drops_on_its_bridge_only() {
        if let Err(why) = netns::available().and_then(|()| Impairment::available()) {
            eprintln!("skipped: {why}");
            return;
        }
        let mut network = Network::create().expect("a network");
        let server = network.server_address();
        let host = network.host("client");
        let peer = network.host("peer");
        let server_port = echo(TcpListener::bind((server, 0)).expect("listens on the bridge"));
        let loopback = echo(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listens"));
        let mut peer_server = Script::start(Some(&peer), &["serve"]);
        let peer_port: u16 = peer_server.line().parse().expect("a port");
        let mut clients = [
            (
                "host -> server",
                Client::connect(Some(&host), server, server_port),
            ),
            (
                "host -> host",
                Client::connect(Some(&host), peer.address, peer_port),
            ),
            (
                "loopback",
                Client::connect(None, Ipv4Addr::LOCALHOST, loopback),
            ),
        ];
        let fast = Duration::from_millis(100);

        let before = medians(&mut clients, "before");
        assert!(before.iter().all(|median| *median < fast), "fast before");

        let delay = Duration::from_millis(200);
        let steady = Link {
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
        };
        let impairment = Impairment::start(&network, steady).expect("impairs");
        let twice = Impairment::start(&network, steady)
            .err()
            .expect("one at a time");
        eprintln!("a second impairment: {twice}");
        let during = medians(&mut clients, "200 ms delay");
        assert!(
            during[..2].iter().all(|median| *median >= 2 * delay),
            "delayed both ways"
        );
        assert!(during[2] < fast, "loopback untouched");
        let (seen, dropped) = impairment.counts();
        eprintln!("200 ms delay: {seen} packets seen, {dropped} dropped");
        assert!(
            seen >= 20 && dropped == 0,
            "every round trip's packets seen, none dropped"
        );
        drop(impairment);
        assert!(!chain_left(&network), "its rules removed");

        let after = medians(&mut clients, "after");
        assert!(after.iter().all(|median| *median < fast), "fast again");

        let lossy = Impairment::start(
            &network,
            Link {
                delay: Duration::from_millis(10),
                jitter: Duration::ZERO,
                loss: 0.2,
            },
        )
        .expect("impairs");
        let started = Instant::now();
        for (name, client) in &mut clients[..2] {
            let times = client.round_trips(10);
            eprintln!("10 ms delay, 20 % loss: {name}: round trips {times:.1?}");
        }
        let (seen, dropped) = lossy.counts();
        eprintln!(
            "10 ms delay, 20 % loss: 20 round trips in {:?}, {seen} packets seen, {dropped} dropped",
            started.elapsed()
        );
        assert!(
            dropped > 0 && dropped < seen,
            "some dropped, and TCP delivered"
        );
        drop(lossy);
        assert!(!chain_left(&network), "its rules removed");
        let healed = medians(&mut clients, "healed");
        assert!(healed.iter().all(|median| *median < fast), "fast again");

        // Datagrams a millisecond apart, held 10 to 40 ms each: they arrive, out of order.
        let jittery = Impairment::start(
            &network,
            Link {
                delay: Duration::from_millis(10),
                jitter: Duration::from_millis(30),
                loss: 0.0,
            },
        )
        .expect("impairs");
        let receiver = UdpSocket::bind((server, 0)).expect("binds on the bridge");
        receiver
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("a timeout");
        let port = receiver.local_addr().expect("an address").port();
        let count = 100;
        let mut sender = Script::start(
            Some(&host),
            &[
                "datagrams",
                &server.to_string(),
                &port.to_string(),
                &count.to_string(),
            ],
        );
        assert_eq!(sender.line(), "sent");
        let mut order = Vec::new();
        let mut buffer = [0u8; 16];
        while order.len() < count {
            let Ok(length) = receiver.recv(&mut buffer) else {
                break;
            };
            let number: usize = std::str::from_utf8(&buffer[..length])
                .expect("text")
                .parse()
                .expect("a number");
            order.push(number);
        }
        drop(jittery);
        let out_of_order = order.windows(2).filter(|pair| pair[1] < pair[0]).count();
        eprintln!("10 ms delay, 30 ms jitter: {out_of_order} of {count} datagrams overtaken");
        assert_eq!(order.len(), count, "every datagram arrived");
        assert!(out_of_order > 0, "reordered");
    }
}
