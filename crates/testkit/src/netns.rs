//! Several cluster nodes on one machine: one Linux network namespace per node, each with its own address and
//! hostname, joined by a bridge in a "switch" namespace; made by the test and removed when it ends.
//!
//! Layout for `TestNetwork::new("hw", &["coord", "a", "b"])` (the prefix gains the pid and a counter, so tests
//! running at once, in threads or processes, never share a namespace):
//!
//! ```text
//!   hw-<pid>-<n>-coord      hw-<pid>-<n>-a          hw-<pid>-<n>-b
//!   eth0 10.X.Y.1/24        eth0 10.X.Y.2/24        eth0 10.X.Y.3/24
//!        |                       |                       |
//!   +----p0----------------------p1----------------------p2----+
//!   |                   br0 in hw-<pid>-<n>-sw                  |
//!   +----------------------------------------------------------+
//! ```
//!
//! Nothing is added to the root network namespace (each veth pair is created with both ends already in their
//! namespaces) and no node has a default route, so nodes reach only each other's addresses and their own
//! loopback. Every network is a separate bridge, so even equal subnets could not mix; the subnet still differs
//! per network (derived from the pid and the counter) to keep addresses in logs unambiguous.

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::cmd::{run_tool, run_tool_unchecked};
use crate::error::{Result, TestkitError};
use crate::wait_until;
use crate::watchdog::Watchdog;

const TOOL_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`TestNetwork::link_up`] waits for the link to carry traffic again.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(20);
/// Where `ip netns add` pins named namespaces.
const NETNS_DIR: &str = "/run/netns";
const BRIDGE: &str = "br0";
/// Node name and namespace prefix: letters, digits and '-', so it is a valid hostname and a safe file name.
const MAX_NAME_LEN: usize = 32;
/// Addresses .1 to .254 of the node /24.
const MAX_NODES: usize = 254;
/// Sets the new UTS namespace's hostname to `$0`, then becomes the program (`exec`, so the caller's child pid is
/// the program's own pid). Writing /proc/sys/kernel/hostname needs no `hostname` binary.
const SET_HOSTNAME_AND_EXEC: &str = r#"printf '%s' "$0" > /proc/sys/kernel/hostname && exec "$@""#;

static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// Emulated cluster nodes, each in its own network namespace, on one bridge; all namespaces deleted on drop.
///
/// Processes started with [`TestNetwork::command`] keep running after the network drops: the namespace names
/// disappear at once, but a namespace (and its veth) lives on until its last process exits. Killing them is the
/// caller's job: hold each child in a [`crate::ChildGuard`] declared *after* the `TestNetwork`, so the children
/// die first.
///
/// Needs root, `ip` (iproute2), `unshare` and `nsenter` (util-linux) and `sh`; see [`TestNetwork::available`].
///
/// ```no_run
/// use hangwatch_testkit::{require, ChildGuard, TestNetwork};
/// # fn t() {
/// let net = require!(TestNetwork::new("hw", &["coord", "a", "b"]));
/// let coord = ChildGuard::spawn(
///     net.command("coord", "python3")
///         .args(["-m", "http.server", "--bind"])
///         .arg(net.addr("coord").to_string()),
///     "coordinator",
/// )
/// .unwrap();
/// net.link_down("b").unwrap(); // b is cut off from coord and a; its processes keep running
/// net.link_up("b").unwrap();
/// # }
/// ```
#[derive(Debug)]
pub struct TestNetwork {
    namespace_prefix: String,
    switch: String,
    nodes: Vec<Node>,
    /// Namespaces made so far, deleted on drop (also when `new` fails half-way).
    created: Vec<String>,
    watchdog: Option<Watchdog>,
}

#[derive(Debug)]
struct Node {
    name: String,
    namespace: String,
    addr: Ipv4Addr,
    /// The veth end attached to the bridge, in the switch namespace.
    bridge_port: String,
}

impl TestNetwork {
    /// Makes the switch namespace `<prefix>-<pid>-<n>-sw` with a bridge, and per name a namespace
    /// `<prefix>-<pid>-<n>-<name>` whose `eth0` has address `10.X.Y.<i+1>/24` (i: the name's index) and is
    /// plugged into the bridge; loopback is up in every node.
    ///
    /// `prefix` and the names: letters, digits and '-' (not first), at most 32 characters; names unique, at most
    /// 254. Not root, or a missing tool, is a skip error ([`TestkitError::skip_reason`]).
    pub fn new(prefix: &str, names: &[&str]) -> Result<Self> {
        check_tools()?;
        validate(prefix, names)?;
        let pid = std::process::id();
        let serial = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let namespace_prefix = format!("{prefix}-{pid}-{serial}");
        let subnet = subnet(pid, serial);
        let nodes: Vec<Node> = names
            .iter()
            .enumerate()
            .map(|(i, name)| Node {
                name: (*name).to_string(),
                namespace: format!("{namespace_prefix}-{name}"),
                addr: node_addr(subnet, i),
                bridge_port: format!("p{i}"),
            })
            .collect();
        let switch = format!("{namespace_prefix}-sw");

        let mut network = TestNetwork {
            namespace_prefix,
            switch,
            nodes,
            created: Vec::new(),
            watchdog: None,
        };
        let all: Vec<&str> = std::iter::once(network.switch.as_str())
            .chain(network.nodes.iter().map(|n| n.namespace.as_str()))
            .collect();
        network.watchdog = Some(Watchdog::arm(
            r#"for ns in "$@"; do ip netns del "$ns" 2>/dev/null; done"#,
            &all,
        )?);
        // On an error below, dropping `network` deletes what was made so far.
        network.build()?;
        Ok(network)
    }

    fn build(&mut self) -> Result<()> {
        let switch = self.switch.clone();
        self.add_namespace(&switch)?;
        ip(&["-n", &switch, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", BRIDGE, "up"])?;
        for i in 0..self.nodes.len() {
            let namespace = self.nodes[i].namespace.clone();
            self.add_namespace(&namespace)?;
            let node = &self.nodes[i];
            let port = node.bridge_port.as_str();
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
            ip(&[
                "link", "add", "eth0", "netns", &namespace, "type", "veth", "peer", "name", port,
                "netns", &switch,
            ])?;
            ip(&["-n", &switch, "link", "set", port, "master", BRIDGE])?;
            ip(&["-n", &switch, "link", "set", port, "up"])?;
            let cidr = format!("{}/24", node.addr);
            ip(&["-n", &namespace, "addr", "add", &cidr, "dev", "eth0"])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
        }
        for node in &self.nodes {
            self.wait_until_linked(node)?;
        }
        Ok(())
    }

    fn add_namespace(&mut self, namespace: &str) -> Result<()> {
        ip(&["netns", "add", namespace])?;
        self.created.push(namespace.to_string());
        Ok(())
    }

    /// `Ok(())` when this machine can build a `TestNetwork` (root, `ip`, `unshare`, `nsenter`, `sh`); otherwise the
    /// reason, ready to print as a skip message.
    pub fn available() -> std::result::Result<(), String> {
        check_tools().map_err(|e| e.to_string())
    }

    /// The node names, in the order given to [`TestNetwork::new`].
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.name.as_str())
    }

    /// The node's address on the bridge.
    ///
    /// # Panics
    /// When `name` is not one of this network's nodes (a typo in the test).
    pub fn addr(&self, name: &str) -> Ipv4Addr {
        self.node(name).addr
    }

    /// The node's network namespace name, for `ip -n <it> ...`; its file is `/run/netns/<it>`.
    ///
    /// # Panics
    /// When `name` is not one of this network's nodes.
    pub fn namespace(&self, name: &str) -> &str {
        &self.node(name).namespace
    }

    /// What every namespace of this network starts with (`<prefix>-<pid>-<n>`); unique to this network.
    pub fn namespace_prefix(&self) -> &str {
        &self.namespace_prefix
    }

    /// A command that runs `program` in node `name`'s network namespace and in a new UTS namespace whose
    /// hostname is `name`. Add the program's arguments with `.arg()`/`.args()`; environment, working directory
    /// and stdio are set on it as on any `Command`.
    ///
    /// The spawned child's pid is the program's own (the wrappers `exec` into it), so signals and /proc reads by
    /// pid reach the program. Unlike `ip netns exec`, the program stays in the test's mount namespace: every
    /// node sees the same mounts, as if shared, including ones mounted or frozen after it started, and an
    /// unmount by the test really unmounts. The price: /sys/class/net shows the host's interfaces; /proc/net,
    /// `ip` and sockets show the node's.
    ///
    /// # Panics
    /// When `name` is not one of this network's nodes.
    pub fn command(&self, name: &str, program: impl AsRef<OsStr>) -> Command {
        let node = self.node(name);
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={NETNS_DIR}/{}", node.namespace))
            .args([
                "--",
                "unshare",
                "--uts",
                "--",
                "sh",
                "-c",
                SET_HOSTNAME_AND_EXEC,
            ])
            .arg(&node.name)
            .arg(program);
        command
    }

    /// Unplugs node `name` from the bridge (its bridge-side veth goes down): it can no longer reach the other
    /// nodes, nor they it; its processes and their sockets stay as they are.
    pub fn link_down(&self, name: &str) -> Result<()> {
        let node = self.try_node(name)?;
        ip(&["-n", &self.switch, "link", "set", &node.bridge_port, "down"])?;
        Ok(())
    }

    /// Plugs node `name` back in, and returns once the link carries traffic again (the bridge port forwards and
    /// the node's `eth0` has its carrier back).
    pub fn link_up(&self, name: &str) -> Result<()> {
        let node = self.try_node(name)?;
        ip(&["-n", &self.switch, "link", "set", &node.bridge_port, "up"])?;
        self.wait_until_linked(node)
    }

    /// Deletes every namespace now and reports what could not be deleted (drop does the same, but can only print).
    pub fn remove(mut self) -> Result<()> {
        self.delete_all()
    }

    fn delete_all(&mut self) -> Result<()> {
        drop(self.watchdog.take());
        let mut first_error = None;
        for namespace in std::mem::take(&mut self.created).iter().rev() {
            if let Err(e) = delete_namespace(namespace) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn wait_until_linked(&self, node: &Node) -> Result<()> {
        let ready = wait_until(LINK_UP_TIMEOUT, Duration::from_millis(20), || {
            let port = run_tool_unchecked(
                "ip",
                &["-n", &self.switch, "-d", "link", "show", &node.bridge_port],
                TOOL_TIMEOUT,
            );
            let eth0 = run_tool_unchecked(
                "ip",
                &["-n", &node.namespace, "link", "show", "eth0"],
                TOOL_TIMEOUT,
            );
            port.is_ok_and(|out| out.stdout.contains("state forwarding"))
                && eth0.is_ok_and(|out| out.stdout.contains("LOWER_UP"))
        });
        if ready {
            Ok(())
        } else {
            Err(TestkitError::Timeout {
                what: format!(
                    "the link of node {} ({}) to come up on bridge {BRIDGE} in {}",
                    node.name, node.bridge_port, self.switch
                ),
                after: LINK_UP_TIMEOUT,
            })
        }
    }

    fn try_node(&self, name: &str) -> Result<&Node> {
        self.nodes.iter().find(|n| n.name == name).ok_or_else(|| {
            TestkitError::Misuse(format!(
                "no node named {name:?} in test network {} (nodes: {})",
                self.namespace_prefix,
                self.names().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    fn node(&self, name: &str) -> &Node {
        match self.try_node(name) {
            Ok(node) => node,
            Err(e) => panic!("{e}"),
        }
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        if let Err(e) = self.delete_all() {
            eprintln!(
                "testkit: could not delete every namespace of test network {}: {e}",
                self.namespace_prefix
            );
        }
    }
}

/// Deletes a named namespace; one that is already gone is fine.
fn delete_namespace(namespace: &str) -> Result<()> {
    let pinned = Path::new(NETNS_DIR).join(namespace);
    if !pinned.exists() {
        return Ok(());
    }
    match run_tool("ip", &["netns", "del", namespace], CLEANUP_TIMEOUT) {
        Err(_) if !pinned.exists() => Ok(()),
        other => other.map(drop),
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run_tool("ip", args, TOOL_TIMEOUT).map(drop)
}

/// Root, then each tool (a missing one is [`TestkitError::Missing`], a skip).
fn check_tools() -> Result<()> {
    crate::require_root().map_err(|_| TestkitError::NotRoot {
        what: "a network-namespace test network",
        uid: nix::unistd::geteuid().as_raw(),
    })?;
    let tools: [(&str, &[&str], &'static str); 4] = [
        (
            "ip",
            &["-V"],
            "install iproute2 (Debian: apt-get install iproute2)",
        ),
        (
            "unshare",
            &["--version"],
            "install util-linux (Debian: apt-get install util-linux)",
        ),
        (
            "nsenter",
            &["--version"],
            "install util-linux (Debian: apt-get install util-linux)",
        ),
        ("sh", &["-c", ":"], "a POSIX shell is needed as `sh`"),
    ];
    for (tool, args, hint) in tools {
        match run_tool(tool, args, TOOL_TIMEOUT) {
            Ok(_) => {}
            Err(TestkitError::Missing { .. }) => {
                return Err(TestkitError::Missing {
                    tool: tool.to_string(),
                    hint,
                })
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Checks the prefix and node names before anything is made.
fn validate(prefix: &str, names: &[&str]) -> Result<()> {
    check_name("namespace prefix", prefix)?;
    if names.is_empty() {
        return Err(TestkitError::Misuse(
            "a test network needs at least one node name".into(),
        ));
    }
    if names.len() > MAX_NODES {
        return Err(TestkitError::Misuse(format!(
            "a test network has room for {MAX_NODES} nodes (one /24), not {}",
            names.len()
        )));
    }
    for (i, name) in names.iter().enumerate() {
        check_name("node name", name)?;
        if *name == "sw" {
            return Err(TestkitError::Misuse(
                "node name \"sw\" is taken by the switch namespace; pick another".into(),
            ));
        }
        if names[..i].contains(name) {
            return Err(TestkitError::Misuse(format!(
                "node name {name:?} is given twice; node names must be unique"
            )));
        }
    }
    Ok(())
}

fn check_name(what: &str, name: &str) -> Result<()> {
    let valid_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if name.is_empty() || name.len() > MAX_NAME_LEN || !valid_chars || name.starts_with('-') {
        return Err(TestkitError::Misuse(format!(
            "{what} {name:?} must be 1 to {MAX_NAME_LEN} letters, digits or '-' (not first), like \"node-1\""
        )));
    }
    Ok(())
}

/// The two middle octets of a network's 10.X.Y.0/24, different for each network of a process and, as far as 16
/// bits allow, between processes.
fn subnet(pid: u32, serial: u32) -> [u8; 2] {
    let mixed = pid.wrapping_mul(97).wrapping_add(serial) as u16;
    mixed.to_be_bytes()
}

fn node_addr(subnet: [u8; 2], index: usize) -> Ipv4Addr {
    let host = u8::try_from(index + 1).unwrap_or(u8::MAX);
    Ipv4Addr::new(10, subnet[0], subnet[1], host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_consecutive_addresses_in_one_slash_24() {
        let subnet = subnet(4242, 3);
        let a = node_addr(subnet, 0);
        let c = node_addr(subnet, 2);
        assert_eq!(a.octets()[..3], c.octets()[..3]);
        assert_eq!((a.octets()[3], c.octets()[3]), (1, 3));
        assert_eq!(node_addr(subnet, MAX_NODES - 1).octets()[3], 254);
    }

    #[test]
    fn networks_of_one_process_get_different_subnets() {
        let subnets: std::collections::HashSet<_> = (0..200).map(|n| subnet(4242, n)).collect();
        assert_eq!(subnets.len(), 200);
    }

    #[test]
    fn bad_names_are_refused_before_anything_is_made() {
        for (prefix, names) in [
            ("", &["a"][..]),
            ("hw", &[][..]),
            ("hw", &["a", "a"][..]),
            ("hw", &["a b"][..]),
            ("hw", &["-a"][..]),
            ("hw", &["sw"][..]),
            ("h/w", &["a"][..]),
        ] {
            let err = validate(prefix, names).unwrap_err();
            assert!(matches!(err, TestkitError::Misuse(_)), "{err}");
        }
        let too_many: Vec<String> = (0..=MAX_NODES).map(|i| format!("n{i}")).collect();
        let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
        assert!(validate("hw", &too_many).is_err());
        validate("hw", &["coord", "node-1", "B2"]).unwrap();
    }
}
