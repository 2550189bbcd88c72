//! The iptables layout and its state: [`ServicePort`]s to `iptables-restore --noflush` input,
//! in full or as only the chains that changed. Pure; [`crate::network::netfilter`] runs the text.
//!
//! kube-proxy's iptables layout with a `GP-` prefix: `GP-SERVICES` (nat, from PREROUTING and
//! OUTPUT) jumps per Service address to `GP-SVC-<hash>` (all endpoints) or `GP-SVL-<hash>`
//! (local ones), which DNAT to an endpoint with `statistic` rules (through an endpoint chain
//! `GP-SEP-<hash>` only for session affinity); `GP-EXT-<hash>` handles external addresses and
//! NodePorts (`GP-NODEPORTS`); `GP-POSTROUTING` masquerades marked and hairpin traffic.
//! Refusals and drops live in the filter table (`GP-SERVICE-CHECK`), where iptables allows
//! them. A partial sync writes only the chains whose rules changed and deletes the ones no
//! longer used, so one endpoint change rewrites one Service chain.

use super::desired::{Endpoint, NodeContext, ObjectKey, Policy, Protocol, Route, ServicePort};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

/// The rules that lead from the built-in chains to ours: (table, chain, rule). A full sync
/// inserts those `iptables-save` lacks, in the same restore.
const JUMPS: [(&str, &str, &str); 6] = [
    ("nat", "PREROUTING", "-j GP-SERVICES"),
    ("nat", "OUTPUT", "-j GP-SERVICES"),
    ("nat", "POSTROUTING", "-j GP-POSTROUTING"),
    ("filter", "INPUT", "-m conntrack --ctstate NEW -j GP-SERVICE-CHECK"),
    ("filter", "FORWARD", "-m conntrack --ctstate NEW -j GP-SERVICE-CHECK"),
    ("filter", "OUTPUT", "-m conntrack --ctstate NEW -j GP-SERVICE-CHECK"),
];

const PREFIX: &str = "GP-";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Table {
    Nat,
    Filter,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }
}

/// Chains every Service adds rules to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Shared {
    Services,
    Nodeports,
    Postrouting,
    ServiceCheck,
}

impl Shared {
    fn table(self) -> Table {
        match self {
            Shared::Services | Shared::Nodeports | Shared::Postrouting => Table::Nat,
            Shared::ServiceCheck => Table::Filter,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Shared::Services => "GP-SERVICES",
            Shared::Nodeports => "GP-NODEPORTS",
            Shared::Postrouting => "GP-POSTROUTING",
            Shared::ServiceCheck => "GP-SERVICE-CHECK",
        }
    }
}

const SHARED: [Shared; 4] = [Shared::Services, Shared::Nodeports, Shared::Postrouting, Shared::ServiceCheck];

/// FNV-1a: stable across releases and processes, so a restarted agent finds the same names.
fn hash(input: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in input.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..13).map(|i| ALPHABET[((h >> (i * 5)) & 31) as usize] as char).collect()
}

/// What one Service contributes: chains of its own and rules in the shared chains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Fragment {
    chains: BTreeMap<(Table, String), Vec<String>>,
    shared: BTreeMap<Shared, Vec<String>>,
}

impl Fragment {
    fn share(&mut self, chain: Shared, rule: String) {
        self.shared.entry(chain).or_default().push(rule);
    }
}

fn proto_match(p: Protocol, port: u16) -> String {
    format!("-p {0} -m {0} --dport {port}", p.name())
}

fn refusal(p: Protocol, route: &Route<'_>) -> &'static str {
    match (route, p) {
        (Route::Drop, _) => "-j DROP",
        (_, Protocol::Tcp) => "-j REJECT --reject-with tcp-reset",
        _ => "-j REJECT --reject-with icmp-port-unreachable",
    }
}

fn service_fragment(node: &NodeContext, ports: &[ServicePort]) -> Fragment {
    let mut f = Fragment::default();
    for sp in ports {
        port_fragment(node, sp, &mut f);
    }
    f
}

fn port_fragment(node: &NodeContext, sp: &ServicePort, f: &mut Fragment) {
    let name = format!("{}/{}", sp.name, sp.protocol.name());
    let h = hash(&name);
    let svc = format!("{PREFIX}SVC-{h}");
    let svl = format!("{PREFIX}SVL-{h}");
    let ext = format!("{PREFIX}EXT-{h}");
    let comment = format!("-m comment --comment \"{name}\"");
    let pm = proto_match(sp.protocol, sp.port);
    let cluster = node.cluster_cidr;
    let cip = sp.cluster_ip;

    // Hairpin: only a Pod on this node can reach itself through this node's rules.
    let mut local: Vec<&Endpoint> =
        sp.cluster_endpoints.iter().chain(&sp.local_endpoints).filter(|e| e.local).collect();
    local.sort();
    local.dedup();
    for ep in local {
        f.share(
            Shared::Postrouting,
            format!("-A GP-POSTROUTING {comment} -s {0}/32 -d {0}/32 -m conntrack --ctstate DNAT -j MASQUERADE", ep.ip),
        );
    }
    // The chains that spread over endpoints. Unlike kube-proxy, an endpoint gets a chain of its
    // own (`GP-SEP-…`) only for session affinity, which must record the choice: iptables-nft's
    // restore grows faster than linearly with the number of chains (BENCHMARKS.md), so the
    // common case DNATs straight from the Service chain.
    let p = sp.protocol.name();
    let dnat = |ep: &Endpoint| format!("-p {p} -m {p} -j DNAT --to-destination {}:{}", ep.ip, ep.port);
    let mut sep_chain = |ep: &Endpoint| {
        let sep = format!("{PREFIX}SEP-{}", hash(&format!("{name}/{}:{}", ep.ip, ep.port)));
        let rules = vec![
            format!("-A {sep} {comment} -m recent --set --name {sep} --mask 255.255.255.255 --rsource"),
            format!("-A {sep} {comment} {}", dnat(ep)),
        ];
        f.chains.insert((Table::Nat, sep.clone()), rules);
        sep
    };
    let mut spread = |chain: &str, endpoints: &[Endpoint], masq_outside: bool| {
        let mut rules = Vec::new();
        if masq_outside {
            rules.push(format!("-A {chain} {comment} ! -s {cluster} -d {cip}/32 {pm} -j {PREFIX}MARK-MASQ"));
        }
        let targets: Vec<String> = match sp.affinity_timeout {
            Some(timeout) => {
                let seps: Vec<String> = endpoints.iter().map(&mut sep_chain).collect();
                for sep in &seps {
                    rules.push(format!(
                        "-A {chain} {comment} -m recent --rcheck --seconds {timeout} --reap --name {sep} --mask 255.255.255.255 --rsource -j {sep}"
                    ));
                }
                seps.iter().map(|sep| format!("-j {sep}")).collect()
            }
            None => endpoints.iter().map(dnat).collect(),
        };
        let n = targets.len();
        for (i, target) in targets.iter().enumerate() {
            if i + 1 < n {
                let p = 1.0 / (n - i) as f64;
                rules.push(format!("-A {chain} {comment} -m statistic --mode random --probability {p:.10} {target}"));
            } else {
                rules.push(format!("-A {chain} {comment} {target}"));
            }
        }
        (Table::Nat, chain.to_owned(), rules)
    };
    let mut own = Vec::new();
    let internal_local = sp.internal_policy == Policy::Local;
    if !sp.cluster_endpoints.is_empty() {
        own.push(spread(&svc, &sp.cluster_endpoints, !internal_local));
    }
    if !sp.local_endpoints.is_empty() && (internal_local || (sp.external_policy == Policy::Local && sp.has_external()))
    {
        own.push(spread(&svl, &sp.local_endpoints, internal_local));
    }
    for (table, chain, rules) in own {
        f.chains.insert((table, chain), rules);
    }

    // The ClusterIP.
    let target = |route: &Route<'_>| match (route, sp.internal_policy) {
        (Route::Endpoints(_), Policy::Cluster) => svc.clone(),
        _ => svl.clone(),
    };
    let internal = sp.internal_route();
    match internal {
        Route::Endpoints(_) => {
            f.share(Shared::Services, format!("-A GP-SERVICES {comment} -d {cip}/32 {pm} -j {}", target(&internal)));
        }
        _ => f.share(
            Shared::ServiceCheck,
            format!("-A GP-SERVICE-CHECK {comment} -d {cip}/32 {pm} {}", refusal(sp.protocol, &internal)),
        ),
    }

    // External addresses and the NodePort.
    if !sp.has_external() {
        return;
    }
    let external = sp.external_route();
    if !matches!(external, Route::Reject) {
        let mut rules = Vec::new();
        match sp.external_policy {
            Policy::Cluster => {
                rules.push(format!("-A {ext} {comment} -j {PREFIX}MARK-MASQ"));
                rules.push(format!("-A {ext} {comment} -j {svc}"));
            }
            Policy::Local => {
                // Pods and the node itself reach every endpoint; the node's traffic masqueraded.
                rules.push(format!("-A {ext} {comment} -s {cluster} -j {svc}"));
                rules.push(format!("-A {ext} {comment} -m addrtype --src-type LOCAL -j {PREFIX}MARK-MASQ"));
                rules.push(format!("-A {ext} {comment} -m addrtype --src-type LOCAL -j {svc}"));
                if let Route::Endpoints(_) = external {
                    rules.push(format!("-A {ext} {comment} -j {svl}"));
                }
            }
        }
        f.chains.insert((Table::Nat, ext.clone()), rules);
    }
    for ip in &sp.external_ips {
        if !matches!(external, Route::Reject) {
            f.share(Shared::Services, format!("-A GP-SERVICES {comment} -d {ip}/32 {pm} -j {ext}"));
        }
        if !matches!(external, Route::Endpoints(_)) {
            f.share(
                Shared::ServiceCheck,
                format!("-A GP-SERVICE-CHECK {comment} -d {ip}/32 {pm} {}", refusal(sp.protocol, &external)),
            );
        }
    }
    if let Some(np) = sp.node_port {
        let npm = proto_match(sp.protocol, np);
        if !matches!(external, Route::Reject) {
            f.share(Shared::Nodeports, format!("-A GP-NODEPORTS {comment} {npm} -j {ext}"));
        }
        if !matches!(external, Route::Endpoints(_)) {
            for ip in &node.node_ips {
                f.share(
                    Shared::ServiceCheck,
                    format!("-A GP-SERVICE-CHECK {comment} -d {ip}/32 {npm} {}", refusal(sp.protocol, &external)),
                );
            }
        }
    }
}

/// The fixed chains and the rules that end the shared ones: (table, chain, rules).
fn fixed_chains(node: &NodeContext) -> Vec<(Table, &'static str, Vec<String>)> {
    vec![
        (Table::Nat, "GP-MARK-MASQ", vec!["-A GP-MARK-MASQ -j MARK --or-mark 0x4000".into()]),
        (
            Table::Nat,
            "GP-POSTROUTING",
            vec![
                "-A GP-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".into(),
                "-A GP-POSTROUTING -j MARK --xor-mark 0x4000".into(),
                "-A GP-POSTROUTING -j MASQUERADE --random-fully".into(),
            ],
        ),
        (
            Table::Nat,
            "GP-SERVICES",
            node.node_ips.iter().map(|ip| format!("-A GP-SERVICES -d {ip}/32 -j GP-NODEPORTS")).collect(),
        ),
        (Table::Nat, "GP-NODEPORTS", Vec::new()),
        (
            Table::Filter,
            "GP-SERVICE-CHECK",
            // An address of the Service range that no rule translated: refuse rather than route it,
            // unless the node holds it itself (cluster DNS's address on its dummy interface).
            vec![
                "-A GP-SERVICE-CHECK -m addrtype --dst-type LOCAL -j RETURN".into(),
                format!("-A GP-SERVICE-CHECK -d {} -j REJECT --reject-with icmp-port-unreachable", node.service_cidr),
            ],
        ),
    ]
}

/// The layout's state: every Service's fragment as the kernel holds it after the last text.
#[derive(Debug)]
pub struct IptablesRules {
    node: NodeContext,
    fragments: HashMap<ObjectKey, Fragment>,
    /// Rules each Service adds to each shared chain, in Service order.
    shared: BTreeMap<Shared, BTreeMap<ObjectKey, Vec<String>>>,
}

impl IptablesRules {
    pub fn new(node: NodeContext) -> Self {
        IptablesRules { node, fragments: HashMap::new(), shared: BTreeMap::new() }
    }

    fn claim(&mut self, key: &ObjectKey, fragment: Fragment) {
        for (chain, rules) in &fragment.shared {
            self.shared.entry(*chain).or_default().insert(key.clone(), rules.clone());
        }
        self.fragments.insert(key.clone(), fragment);
    }

    fn release(&mut self, key: &ObjectKey) -> Option<Fragment> {
        let fragment = self.fragments.remove(key)?;
        for chain in fragment.shared.keys() {
            if let Some(m) = self.shared.get_mut(chain) {
                m.remove(key);
            }
        }
        Some(fragment)
    }

    /// A shared chain's rules: every Service's, then the fixed tail.
    fn shared_rules(&self, chain: Shared, fixed: &[(Table, &'static str, Vec<String>)]) -> Vec<String> {
        let mut seen = BTreeSet::new();
        let tail = fixed.iter().filter(|(_, n, _)| *n == chain.name()).flat_map(|(_, _, r)| r.iter());
        self.shared
            .get(&chain)
            .into_iter()
            .flat_map(|m| m.values().flatten())
            .chain(tail)
            .filter(|r| seen.insert(*r))
            .cloned()
            .collect()
    }

    /// The whole rule set for `iptables-restore --noflush`: every chain of ours declared (which
    /// empties it) and filled, and chains of ours in `iptables_save` no longer wanted deleted.
    pub fn full<'a>(
        &mut self,
        services: impl IntoIterator<Item = (&'a ObjectKey, &'a [ServicePort])>,
        iptables_save: &str,
    ) -> String {
        self.fragments.clear();
        self.shared.clear();
        for (key, ports) in services {
            let fragment = service_fragment(&self.node, ports);
            self.claim(key, fragment);
        }
        self.render(iptables_save)
    }

    /// The full input for the current state (what [`Self::full`] returns).
    pub fn render(&self, iptables_save: &str) -> String {
        let fixed = fixed_chains(&self.node);
        let mut out = String::new();
        for table in [Table::Nat, Table::Filter] {
            let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (t, name, rules) in &fixed {
                if *t == table {
                    chains.insert((*name).to_owned(), rules.clone());
                }
            }
            for chain in SHARED.into_iter().filter(|c| c.table() == table) {
                chains.insert(chain.name().to_owned(), self.shared_rules(chain, &fixed));
            }
            for f in self.fragments.values() {
                for ((t, name), rules) in &f.chains {
                    if *t == table {
                        chains.insert(name.clone(), rules.clone());
                    }
                }
            }
            let stale: Vec<String> =
                existing_chains(iptables_save, table.name()).into_iter().filter(|c| !chains.contains_key(c)).collect();
            let _ = writeln!(out, "*{}", table.name());
            for name in chains.keys().chain(&stale) {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for rules in chains.values() {
                for r in rules {
                    let _ = writeln!(out, "{r}");
                }
            }
            for name in &stale {
                let _ = writeln!(out, "-X {name}");
            }
            for (t, chain, rule) in JUMPS {
                if t == table.name() && !has_rule(iptables_save, t, &format!("-A {chain} {rule}")) {
                    let _ = writeln!(out, "-I {chain} 1 {rule}");
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Input for `iptables-restore --noflush` that rewrites only the chains whose rules differ
    /// once each of `changed` has these ports (none: the Service is gone). Empty when nothing
    /// differs.
    pub fn update<'a>(&mut self, changed: impl IntoIterator<Item = (&'a ObjectKey, &'a [ServicePort])>) -> String {
        let mut before: BTreeMap<(Table, String), Vec<String>> = BTreeMap::new();
        let mut after: BTreeMap<(Table, String), Vec<String>> = BTreeMap::new();
        let mut dirty_shared = BTreeSet::new();
        for (key, ports) in changed {
            let old = self.release(key).unwrap_or_default();
            let new = if ports.is_empty() { Fragment::default() } else { service_fragment(&self.node, ports) };
            for chain in old.shared.keys().chain(new.shared.keys()) {
                if old.shared.get(chain) != new.shared.get(chain) {
                    dirty_shared.insert(*chain);
                }
            }
            for (k, rules) in old.chains.iter() {
                before.entry(k.clone()).or_insert_with(|| rules.clone());
            }
            for (k, rules) in new.chains.iter() {
                after.insert(k.clone(), rules.clone());
            }
            if !ports.is_empty() {
                self.claim(key, new);
            }
        }
        let fixed = fixed_chains(&self.node);
        let mut out = String::new();
        for table in [Table::Nat, Table::Filter] {
            let mut write: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for ((t, name), rules) in &after {
                if *t == table && before.get(&(*t, name.clone())) != Some(rules) {
                    write.insert(name.clone(), rules.clone());
                }
            }
            for chain in dirty_shared.iter().filter(|c| c.table() == table) {
                write.insert(chain.name().to_owned(), self.shared_rules(*chain, &fixed));
            }
            let delete: Vec<&String> = before
                .keys()
                .filter(|(t, name)| *t == table && !after.contains_key(&(*t, name.clone())))
                .map(|(_, name)| name)
                .collect();
            if write.is_empty() && delete.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{}", table.name());
            // Declaring a chain empties it; a chain must be empty to be deleted.
            for name in write.keys().chain(delete.iter().copied()) {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for rules in write.values() {
                for r in rules {
                    let _ = writeln!(out, "{r}");
                }
            }
            for name in delete {
                let _ = writeln!(out, "-X {name}");
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// Whether `iptables-save` output has `rule` in `table`.
/// Input for `iptables-restore --noflush` that removes everything of ours in `iptables_save`:
/// the jumps from the built-in chains, then our chains (emptied first, so that none is still
/// referenced when it goes). Empty when nothing of ours is there.
pub fn removal(iptables_save: &str) -> String {
    let mut out = String::new();
    for table in [Table::Nat, Table::Filter] {
        let chains = existing_chains(iptables_save, table.name());
        let jumps: Vec<_> = JUMPS
            .iter()
            .filter(|(t, chain, rule)| *t == table.name() && has_rule(iptables_save, t, &format!("-A {chain} {rule}")))
            .collect();
        if chains.is_empty() && jumps.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{}", table.name());
        for name in &chains {
            let _ = writeln!(out, ":{name} - [0:0]");
        }
        for (_, chain, rule) in jumps {
            let _ = writeln!(out, "-D {chain} {rule}");
        }
        for name in &chains {
            let _ = writeln!(out, "-X {name}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

fn has_rule(iptables_save: &str, table: &str, rule: &str) -> bool {
    let mut in_table = false;
    iptables_save.lines().any(|line| {
        if let Some(t) = line.strip_prefix('*') {
            in_table = t == table;
        }
        in_table && line == rule
    })
}

/// Our chains (`:GP-…` lines) in one table's section of `iptables-save` output.
fn existing_chains(iptables_save: &str, table: &str) -> Vec<String> {
    let mut in_table = false;
    let mut out = Vec::new();
    for line in iptables_save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            in_table = t == table;
        } else if in_table
            && let Some(rest) = line.strip_prefix(':')
            && rest.starts_with(PREFIX)
            && let Some(name) = rest.split_whitespace().next()
        {
            out.push(name.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_takes_our_jumps_and_chains_and_nothing_else() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:GP-SERVICES - [0:0]\n:OTHER - [0:0]\n\
                    -A PREROUTING -j GP-SERVICES\n-A OUTPUT -j OTHER\nCOMMIT\n\
                    *filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n";
        assert_eq!(
            removal(save),
            "*nat\n:GP-SERVICES - [0:0]\n-D PREROUTING -j GP-SERVICES\n-X GP-SERVICES\nCOMMIT\n",
            "the filter table holds nothing of ours, so it is not touched"
        );
        assert_eq!(removal("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"), "");
    }
}
