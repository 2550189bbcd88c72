//! Rule programming benchmark: prints one Markdown table.
//!
//! `cargo bench -p gitplane-nodeagent --bench proxy` (root; about two minutes). Every
//! measurement runs in a fresh network namespace this process makes and removes. Options:
//! `--services N` (10000), `--endpoints M` (10), `--changes K` (20 endpoint changes, median
//! and max), `--compare-services N` (2000: the scale of the layout comparison),
//! `--skip-iptables`.
//!
//! Rows: the pure core alone; per backend the Proxier's full sync and one endpoint change next
//! to the floor, which is `nft -f` / `iptables-restore` of the very text the Proxier generated,
//! timed alone in a namespace in the same state; and the layout comparison that chose the nft
//! design: kube-proxy's layout (a chain per Service and per endpoint, an anonymous `numgen`
//! vmap per Service), the same chains without the anonymous vmaps, and gitplane's maps.

use gitplane_nodeagent::network::proxy::desired::{self, Ipv4Cidr, NodeContext, ObjectKey, ServicePort};
use gitplane_nodeagent::network::proxy::iptables::IptablesRules;
use gitplane_nodeagent::network::proxy::nft::NftRules;
use gitplane_nodeagent::network::proxy::{Backend, Proxier};
use gitplane_testkit::topology::{Topology, in_netns};
use k8s_openapi::api::core::v1::{Service, ServicePort as K8sServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Options {
    services: usize,
    endpoints: usize,
    changes: usize,
    compare_services: usize,
    iptables: bool,
}

fn options() -> Options {
    let mut o = Options { services: 10_000, endpoints: 10, changes: 20, compare_services: 2_000, iptables: true };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> usize {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match a.as_str() {
            "--services" => o.services = num("--services"),
            "--endpoints" => o.endpoints = num("--endpoints"),
            "--changes" => o.changes = num("--changes"),
            "--compare-services" => o.compare_services = num("--compare-services"),
            "--skip-iptables" => o.iptables = false,
            // cargo bench passes --bench.
            _ => {}
        }
    }
    o
}

fn node() -> NodeContext {
    NodeContext {
        node_name: "node-a".into(),
        node_ips: vec![gitplane_testkit::topology::NODE_IP],
        cluster_cidr: "10.244.0.0/16".parse::<Ipv4Cidr>().unwrap(),
        service_cidr: "10.96.0.0/12".parse::<Ipv4Cidr>().unwrap(),
    }
}

fn cluster_ip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + 1 + s as u32)
}

fn endpoint_ip(s: usize, e: usize, endpoints: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 1, 0)) + (s * endpoints + e) as u32)
}

fn service(s: usize) -> Service {
    Service {
        metadata: ObjectMeta { namespace: Some("bench".into()), name: Some(format!("svc-{s}")), ..Default::default() },
        spec: Some(ServiceSpec {
            cluster_ip: Some(cluster_ip(s).to_string()),
            ports: Some(vec![K8sServicePort { name: Some("http".into()), port: 80, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Service `s`'s slice; `generation` moves its first endpoint (one endpoint change).
fn slice(s: usize, endpoints: usize, generation: usize) -> EndpointSlice {
    let mut eps: Vec<Endpoint> = (0..endpoints)
        .map(|e| Endpoint {
            addresses: vec![endpoint_ip(s, e, endpoints).to_string()],
            conditions: Some(EndpointConditions { ready: Some(true), ..Default::default() }),
            node_name: Some(if e % 4 == 0 { "node-a" } else { "node-b" }.into()),
            ..Default::default()
        })
        .collect();
    if generation > 0 {
        eps[0].addresses = vec![Ipv4Addr::new(10, 245, (generation / 256) as u8, (generation % 256) as u8).to_string()];
    }
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some("bench".into()),
            name: Some(format!("svc-{s}-1")),
            labels: Some([(desired::SERVICE_NAME_LABEL.to_owned(), format!("svc-{s}"))].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: eps,
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// Wall time and CPU time (this process and its children, user + system) of one operation:
/// this machine's cores are shared, so CPU time is the steadier figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    wall: Duration,
    cpu: Duration,
}

fn cpu_now() -> Duration {
    let mut total = Duration::ZERO;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        for t in [u.ru_utime, u.ru_stime] {
            total += Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
        }
    }
    total
}

fn measure<T>(f: impl FnOnce() -> T) -> (T, Cost) {
    let (wall, cpu) = (Instant::now(), cpu_now());
    let out = f();
    (out, Cost { wall: wall.elapsed(), cpu: cpu_now().saturating_sub(cpu) })
}

/// Runs `program args` with `text` on stdin in the calling thread's namespace.
fn timed(program: &str, args: &[&str], text: &str) -> Cost {
    measure(|| run(program, args, text)).1
}

fn run(program: &str, args: &[&str], text: &str) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{program} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 { format!("{:.0} ms", ms) } else { format!("{ms:.1} ms") }
}

/// `wall (CPU cpu)`.
fn cost(c: Cost) -> String {
    format!("{} (CPU {})", ms(c.wall), ms(c.cpu))
}

fn median_max(mut v: Vec<Cost>) -> (Cost, Cost) {
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

struct Row {
    what: String,
    scale: String,
    time: String,
    floor: String,
    note: String,
}

/// Wall and CPU ratios.
fn ratio(a: Cost, b: Cost) -> String {
    format!(
        "{:.2}× wall, {:.2}× CPU",
        a.wall.as_secs_f64() / b.wall.as_secs_f64(),
        a.cpu.as_secs_f64() / b.cpu.as_secs_f64()
    )
}

/// One backend against `n` Services: the Proxier's full sync and endpoint changes, each next
/// to the floor of the same text run alone.
fn backend_rows(o: &Options, backend: Backend, rows: &mut Vec<Row>) {
    let n = o.services;
    let scale = format!("{n} × {}", o.endpoints);
    let (program, args): (&str, &[&str]) = match backend {
        Backend::Nftables => ("nft", &["-f", "-"]),
        Backend::Iptables => ("iptables-restore", &["-w", "--noflush"]),
    };
    let label = match backend {
        Backend::Nftables => "nftables",
        Backend::Iptables => "iptables",
    };
    let services: Vec<Service> = (0..n).map(service).collect();
    let slices: Vec<EndpointSlice> = (0..n).map(|s| slice(s, o.endpoints, 0)).collect();

    // The Proxier, as the agent drives it.
    let topo = Topology::new(0);
    let mut proxier = Proxier::new(node(), backend);
    proxier.replace_all(services.clone(), slices.clone());
    let (r, full) = measure(|| in_netns(&topo.node, || proxier.sync().unwrap()));
    assert!(r.full);
    let mut changes = Vec::new();
    for g in 1..=o.changes {
        let s = (g * 7919) % n;
        proxier.update_endpoint_slice(slice(s, o.endpoints, g));
        let (r, c) = measure(|| in_netns(&topo.node, || proxier.sync().unwrap()));
        assert!(!r.full && r.services == 1);
        changes.push(c);
    }
    // Repair / restart: a new Proxier adopts the full table in place.
    let mut restarted = Proxier::new(node(), backend);
    restarted.replace_all(services.clone(), slices.clone());
    let (_, readopt) = measure(|| in_netns(&topo.node, || restarted.sync().unwrap()));
    drop(topo);

    // The floor: the same text, generated outside the clock, run alone.
    let node_ctx = node();
    let before = desired::desired(&node_ctx, &services, &slices);
    let topo = Topology::new(0);
    let (full_floor, readopt_floor, change_floors) = in_netns(&topo.node, || match backend {
        Backend::Nftables => {
            let mut rules = NftRules::new(node_ctx.clone());
            let full_text = rules.full(before.iter().map(|(k, v)| (k, v.as_slice())), &[]);
            let full_floor = timed(program, args, &full_text);
            let readopt_floor = timed(program, args, &full_text);
            let floors = change_texts(o, &before, &mut |c| rules.update(c).0)
                .into_iter()
                .map(|t| timed(program, args, &t))
                .collect::<Vec<_>>();
            (full_floor, readopt_floor, floors)
        }
        Backend::Iptables => {
            let mut rules = IptablesRules::new(node_ctx.clone());
            let full_text = rules.full(before.iter().map(|(k, v)| (k, v.as_slice())), "");
            let full_floor = timed(program, args, &full_text);
            let readopt_floor = timed(program, args, &full_text);
            let floors = change_texts(o, &before, &mut |c| rules.update(c))
                .into_iter()
                .map(|t| timed(program, args, &t))
                .collect::<Vec<_>>();
            (full_floor, readopt_floor, floors)
        }
    });
    drop(topo);

    rows.push(Row {
        what: format!("{label}: full sync, empty table"),
        scale: scale.clone(),
        time: cost(full),
        floor: cost(full_floor),
        note: format!("{} of the floor", ratio(full, full_floor)),
    });
    rows.push(Row {
        what: format!("{label}: full sync over its own table (restart, repair)"),
        scale: scale.clone(),
        time: cost(readopt),
        floor: cost(readopt_floor),
        note: format!("{} of the floor", ratio(readopt, readopt_floor)),
    });
    let (med, max) = median_max(changes);
    let (fmed, fmax) = median_max(change_floors);
    rows.push(Row {
        what: format!("{label}: one endpoint change (partial sync)"),
        scale,
        time: format!("{}, max {}", cost(med), ms(max.wall)),
        floor: format!("{}, max {}", cost(fmed), ms(fmax.wall)),
        note: format!("median of {}; {} of the floor", o.changes, ratio(med, fmed)),
    });
}

/// The Services that changed, with their new ports.
type Changes<'a> = Vec<(&'a ObjectKey, &'a [ServicePort])>;

/// The update texts for the same endpoint changes the Proxier made.
fn change_texts(
    o: &Options,
    before: &BTreeMap<ObjectKey, Vec<ServicePort>>,
    update: &mut dyn FnMut(Changes<'_>) -> String,
) -> Vec<String> {
    let node_ctx = node();
    let mut texts = Vec::new();
    for g in 1..=o.changes {
        let s = (g * 7919) % o.services;
        let key: ObjectKey = ("bench".into(), format!("svc-{s}"));
        let ports = desired::service_rules(&node_ctx, &service(s), &[&slice(s, o.endpoints, g)]).ports;
        assert!(before.contains_key(&key));
        texts.push(update(vec![(&key, ports.as_slice())]));
    }
    texts
}

/// kube-proxy's nft layout for `n` Services: a chain per Service and per endpoint; with
/// `vmap` each Service chain picks its endpoint with an anonymous `numgen` vmap, without it
/// the Service chain just jumps to its first endpoint (the same chains, no anonymous sets).
fn kube_proxy_layout(n: usize, endpoints: usize, vmap: bool) -> String {
    let mut out = String::new();
    let t = "kube-proxy";
    let _ = writeln!(out, "add table ip {t}");
    let _ = writeln!(out, "add map ip {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; }}");
    let _ = writeln!(out, "add chain ip {t} mark-for-masquerade");
    let _ = writeln!(out, "add rule ip {t} mark-for-masquerade meta mark set meta mark or 0x4000");
    let _ = writeln!(out, "add chain ip {t} services");
    let _ = writeln!(out, "add rule ip {t} services ip daddr . meta l4proto . th dport vmap @service-ips");
    let _ =
        writeln!(out, "add chain ip {t} nat-prerouting {{ type nat hook prerouting priority -100; policy accept; }}");
    let _ = writeln!(out, "add rule ip {t} nat-prerouting jump services");
    for s in 0..n {
        let cip = cluster_ip(s);
        for e in 0..endpoints {
            let ep = endpoint_ip(s, e, endpoints);
            let _ = writeln!(out, "add chain ip {t} endpoint-{s}-{e}");
            let _ = writeln!(out, "add rule ip {t} endpoint-{s}-{e} ip saddr {ep} jump mark-for-masquerade");
            let _ = writeln!(out, "add rule ip {t} endpoint-{s}-{e} meta l4proto tcp dnat to {ep}:8080");
        }
        let _ = writeln!(out, "add chain ip {t} service-{s}");
        let _ = writeln!(
            out,
            "add rule ip {t} service-{s} ip daddr {cip} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
        );
        let _ = writeln!(out, "{}", kube_proxy_pick(s, endpoints, vmap, 0));
        let _ = writeln!(out, "add element ip {t} service-ips {{ {cip} . tcp . 80 : goto service-{s} }}");
    }
    out
}

fn kube_proxy_pick(s: usize, endpoints: usize, vmap: bool, first: usize) -> String {
    if vmap {
        let arms: Vec<String> = (0..endpoints).map(|e| format!("{e} : goto endpoint-{s}-{}", e + first)).collect();
        format!("add rule ip kube-proxy service-{s} numgen random mod {endpoints} vmap {{ {} }}", arms.join(", "))
    } else {
        format!("add rule ip kube-proxy service-{s} goto endpoint-{s}-{first}")
    }
}

/// kube-proxy's transaction for one endpoint change of Service `s`: a new endpoint chain, the
/// Service chain rewritten, the old endpoint chain deleted.
fn kube_proxy_change(s: usize, endpoints: usize, vmap: bool) -> String {
    let t = "kube-proxy";
    let new = endpoints;
    let mut out = String::new();
    let _ = writeln!(out, "add chain ip {t} endpoint-{s}-{new}");
    let _ = writeln!(out, "add rule ip {t} endpoint-{s}-{new} ip saddr 10.245.0.1 jump mark-for-masquerade");
    let _ = writeln!(out, "add rule ip {t} endpoint-{s}-{new} meta l4proto tcp dnat to 10.245.0.1:8080");
    let _ = writeln!(out, "flush chain ip {t} service-{s}");
    let _ = writeln!(
        out,
        "add rule ip {t} service-{s} ip daddr {} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
        cluster_ip(s)
    );
    let _ = writeln!(out, "{}", kube_proxy_pick(s, endpoints, vmap, 1));
    let _ = writeln!(out, "flush chain ip {t} endpoint-{s}-0");
    let _ = writeln!(out, "delete chain ip {t} endpoint-{s}-0");
    out
}

fn compare_rows(o: &Options, rows: &mut Vec<Row>) {
    let n = o.compare_services;
    let scale = format!("{n} × {}", o.endpoints);
    let s = n / 2;
    for (what, vmap) in [
        ("layout: kube-proxy's (chain per Service and endpoint, anonymous numgen vmap)", true),
        ("layout: kube-proxy's chains without the anonymous vmaps", false),
    ] {
        let text = kube_proxy_layout(n, o.endpoints, vmap);
        let topo = Topology::new(0);
        let (full, change) = in_netns(&topo.node, || {
            let full = timed("nft", &["-f", "-"], &text);
            let change = timed("nft", &["-f", "-"], &kube_proxy_change(s, o.endpoints, vmap));
            (full, change)
        });
        rows.push(Row {
            what: format!("{what}: `nft -f` of the full set"),
            scale: scale.clone(),
            time: cost(full),
            floor: String::new(),
            note: format!("{} chains", n * (o.endpoints + 1)),
        });
        rows.push(Row {
            what: format!("{what}: one endpoint change"),
            scale: scale.clone(),
            time: cost(change),
            floor: String::new(),
            note: "new endpoint chain, Service chain rewritten, old one deleted".into(),
        });
    }
    let services: Vec<Service> = (0..n).map(service).collect();
    let slices: Vec<EndpointSlice> = (0..n).map(|s| slice(s, o.endpoints, 0)).collect();
    let before = desired::desired(&node(), &services, &slices);
    let mut rules = NftRules::new(node());
    let text = rules.full(before.iter().map(|(k, v)| (k, v.as_slice())), &[]);
    let small = Options { services: n, changes: 1, ..*o };
    let change = change_texts(&small, &before, &mut |c| rules.update(c).0).remove(0);
    let topo = Topology::new(0);
    let (full, change) =
        in_netns(&topo.node, || (timed("nft", &["-f", "-"], &text), timed("nft", &["-f", "-"], &change)));
    rows.push(Row {
        what: "layout: gitplane's (named maps, parametric chains): `nft -f` of the full set".into(),
        scale: scale.clone(),
        time: cost(full),
        floor: String::new(),
        note: format!("{} chains", text.matches("add chain").count()),
    });
    rows.push(Row {
        what: "layout: gitplane's: one endpoint change".into(),
        scale,
        time: cost(change),
        floor: String::new(),
        note: "element deletes and adds".into(),
    });
}

fn main() {
    let o = options();
    let mut rows = Vec::new();

    let services: Vec<Service> = (0..o.services).map(service).collect();
    let slices: Vec<EndpointSlice> = (0..o.services).map(|s| slice(s, o.endpoints, 0)).collect();
    let (desired, core) = measure(|| desired::desired(&node(), &services, &slices));
    let mut rules = NftRules::new(node());
    let (text, render) = measure(|| rules.full(desired.iter().map(|(k, v)| (k, v.as_slice())), &[]));
    rows.push(Row {
        what: "pure core: Services × EndpointSlices → Service ports".into(),
        scale: format!("{} × {}", o.services, o.endpoints),
        time: cost(core),
        floor: String::new(),
        note: "no I/O".into(),
    });
    rows.push(Row {
        what: "nft layout: Service ports → full `nft -f` text".into(),
        scale: format!("{} × {}", o.services, o.endpoints),
        time: cost(render),
        floor: String::new(),
        note: format!("{:.1} MB of text", text.len() as f64 / 1e6),
    });
    drop((services, slices, desired, text, rules));

    eprintln!("nftables...");
    backend_rows(&o, Backend::Nftables, &mut rows);
    if o.iptables {
        eprintln!("iptables...");
        backend_rows(&o, Backend::Iptables, &mut rows);
    }
    eprintln!("layouts...");
    compare_rows(&o, &mut rows);

    println!("| what | Services × endpoints | time | floor (same text, alone) | note |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} | {} | {} |", r.what, r.scale, r.time, r.floor, r.note);
    }
}
