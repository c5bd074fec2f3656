//! A private network of the suite's own, for faults that cross a network: a bridge in this
//! process's network namespace with an address per server, and one network namespace per
//! "host" (a service, a worker) joined to it by a veth pair on a private subnet. A process
//! started in a host ([`Host::wrap`]) reaches the servers only through its link, so the suite
//! can cut it from one server ([`Network::cut`]: packets to that address dropped, the process
//! alive and its sockets open) or from everything ([`Network::isolate`]: its link down), and
//! heal either.
//!
//! Creating namespaces needs `CAP_NET_ADMIN` and iproute2's `ip`; [`Network::create`] says why
//! it cannot, and the suite then runs its process faults only. Delay and loss on its links:
//! [`crate::impair`].
//!
//! Everything is named after a random tag, so suites in parallel do not meet, and removed on
//! drop (a namespace's veth goes with it).

use std::net::Ipv4Addr;
use std::process::Command;

/// Why a network cannot be made here.
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The bridge, its server addresses and the hosts made so far.
pub struct Network {
    tag: String,
    /// The first three octets of the subnet, a /24.
    subnet: [u8; 3],
    /// Addresses given to the bridge (servers listen there), by last octet.
    servers: Vec<u8>,
    hosts: Vec<Host>,
}

/// One network namespace joined to the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    namespace: String,
    /// The veth end left on the bridge, in this process's namespace.
    outer: String,
    pub address: Ipv4Addr,
}

/// Runs `ip` with `args`; its error output when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("cannot run `ip` ({error}); install iproute2"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn must(result: Result<(), String>) {
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// Whether this machine lets the suite make namespaces (it makes one and removes it).
pub fn available() -> Result<(), Unavailable> {
    let probe = format!(
        "palisade-probe-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    ip(&["netns", "add", &probe])
        .and_then(|()| ip(&["netns", "del", &probe]))
        .map_err(|error| Unavailable(format!("no network namespaces here: {error}")))
}

impl Network {
    /// A bridge on a random private /24 (10.200–249.x.0), up, with no server address yet.
    pub fn create() -> Result<Self, Unavailable> {
        let random = uuid::Uuid::new_v4();
        let bytes = random.as_bytes();
        let tag = format!("{:02x}{:02x}{:02x}", bytes[0], bytes[1], bytes[2]);
        let network = Self {
            subnet: [10, 200 + bytes[3] % 50, bytes[4]],
            servers: Vec::new(),
            hosts: Vec::new(),
            tag,
        };
        available()?;
        ip(&["link", "add", &network.bridge(), "type", "bridge"])
            .and_then(|()| ip(&["link", "set", &network.bridge(), "up"]))
            .map_err(|error| Unavailable(format!("no bridge here: {error}")))?;
        Ok(network)
    }

    /// The bridge's interface name (`pal<tag>`): every packet between two of this network's
    /// hosts, or a host and a server address, crosses it.
    pub fn bridge(&self) -> String {
        format!("pal{}", self.tag)
    }

    fn address(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], last)
    }

    /// A new address on the bridge for a server to listen on (reachable from this process
    /// too), so that a host can be cut from that server alone.
    pub fn server_address(&mut self) -> Ipv4Addr {
        let last = 1 + self.servers.len() as u8;
        assert!(last < 20, "at most 19 server addresses");
        let address = self.address(last);
        must(ip(&[
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            &self.bridge(),
        ]));
        self.servers.push(last);
        address
    }

    /// A new namespace joined to the bridge, its loopback and link up.
    pub fn host(&mut self, name: &str) -> Host {
        let index = self.hosts.len();
        assert!(index < 200, "at most 200 hosts");
        let host = Host {
            name: name.to_owned(),
            namespace: format!("palisade-{}-{index}", self.tag),
            outer: format!("pal{}o{index}", self.tag),
            address: self.address(20 + index as u8),
        };
        let inner = format!("pal{}i{index}", self.tag);
        let ns = host.namespace.as_str();
        must(ip(&["netns", "add", ns]));
        // Recorded now, so a failure below still removes the namespace.
        self.hosts.push(host.clone());
        must(ip(&["-n", ns, "link", "set", "lo", "up"]));
        must(ip(&[
            "link",
            "add",
            &host.outer,
            "type",
            "veth",
            "peer",
            "name",
            &inner,
            "netns",
            ns,
        ]));
        must(ip(&["link", "set", &host.outer, "master", &self.bridge()]));
        must(ip(&["link", "set", &host.outer, "up"]));
        must(ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", host.address),
            "dev",
            &inner,
        ]));
        must(ip(&["-n", ns, "link", "set", &inner, "up"]));
        host
    }

    /// Drops whatever `host` sends to `server` (a blackhole route in its namespace): its
    /// connections there stay open and hear nothing, as across a partition; new ones fail.
    pub fn cut(&self, host: &Host, server: Ipv4Addr) {
        must(ip(&[
            "-n",
            &host.namespace,
            "route",
            "add",
            "blackhole",
            &format!("{server}/32"),
        ]));
    }

    /// Undoes [`Network::cut`].
    pub fn heal(&self, host: &Host, server: Ipv4Addr) {
        must(ip(&[
            "-n",
            &host.namespace,
            "route",
            "del",
            "blackhole",
            &format!("{server}/32"),
        ]));
    }

    /// Takes `host`'s link down: it reaches nothing and nothing reaches it.
    pub fn isolate(&self, host: &Host) {
        must(ip(&["link", "set", &host.outer, "down"]));
    }

    /// Undoes [`Network::isolate`].
    pub fn rejoin(&self, host: &Host) {
        must(ip(&["link", "set", &host.outer, "up"]));
    }
}

impl Host {
    /// `program` and `args` as run inside this host: `ip netns exec <namespace> program
    /// args…`. `ip` enters the namespace and then executes the program in its own place, so
    /// the child's pid is the program's (signals reach it).
    pub fn wrap(&self, program: &std::path::Path, args: &[String]) -> (String, Vec<String>) {
        let mut wrapped = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.namespace.clone(),
            program.display().to_string(),
        ];
        wrapped.extend(args.iter().cloned());
        ("ip".to_owned(), wrapped)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = ip(&["netns", "del", &host.namespace]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host reaches a server address on the bridge, not once cut from it, and again once
    /// healed; isolated it reaches nothing.
    #[test]
    fn cut_isolate_and_heal() {
        let mut network = match Network::create() {
            Ok(network) => network,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let server = network.server_address();
        let listener = std::net::TcpListener::bind((server, 0)).expect("listens on the bridge");
        let port = listener.local_addr().unwrap().port();
        let host = network.host("probe");
        let reaches = |host: &Host| {
            let (program, args) = host.wrap(
                std::path::Path::new("bash"),
                &[
                    "-c".into(),
                    format!("timeout 2 bash -c 'exec 3<>/dev/tcp/{server}/{port}'"),
                ],
            );
            Command::new(program)
                .args(args)
                .status()
                .expect("runs")
                .success()
        };
        assert!(reaches(&host), "a joined host reaches the server");
        network.cut(&host, server);
        assert!(!reaches(&host), "a cut host does not");
        network.heal(&host, server);
        assert!(reaches(&host), "a healed one does again");
        network.isolate(&host);
        assert!(!reaches(&host), "an isolated host reaches nothing");
        network.rejoin(&host);
        assert!(reaches(&host), "and again once it rejoins");
    }
}
