//! Snapshot tests of the proxy's pure core and both layouts, driven by `tests/proxy/cases`.
//! Each case checks in what the core decides (`desired.txt`) and the text each layout renders
//! for a full sync and for the case's update. After a deliberate change, refresh them with
//! `UPDATE_SNAPSHOTS=1 cargo test -p gitplane-nodeagent --test t10_proxy_rules` and review the diff.

#[path = "proxy/cases.rs"]
mod cases;

use gitplane_nodeagent::network::proxy::iptables::IptablesRules;
use gitplane_nodeagent::network::proxy::nft::NftRules;
use std::fmt::Write;

fn check(case: &cases::Case, file: &str, actual: &str, failures: &mut Vec<String>) {
    let path = case.dir.join(file);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        failures.push(format!("{}/{file} differs; actual:\n{actual}", case.name));
    }
}

#[test]
fn t10_rules_match_the_snapshots() {
    let mut failures = Vec::new();
    for case in cases::all() {
        let before = case.desired();
        let after = case.desired_after_update();
        let mut desired = String::new();
        for (label, state) in [("before", &before), ("after the update", &after)] {
            let _ = writeln!(desired, "## {label}");
            for ports in state.values() {
                for p in ports {
                    let _ = writeln!(desired, "{p:#?}");
                }
            }
        }
        check(&case, "desired.txt", &desired, &mut failures);

        let mut nft = NftRules::new(case.node.clone());
        let full = nft.full(before.iter().map(|(k, v)| (k, v.as_slice())), &[]);
        check(&case, "nft.full", &full, &mut failures);
        let (update, removed) = nft.update(cases::changes(&before, &after));
        let mut update = update;
        for ep in removed {
            let _ = writeln!(update, "# affinity entries of {ep} to delete");
        }
        check(&case, "nft.update", &update, &mut failures);

        let mut ipt = IptablesRules::new(case.node.clone());
        let full = ipt.full(before.iter().map(|(k, v)| (k, v.as_slice())), "");
        check(&case, "iptables.full", &full, &mut failures);
        let update = ipt.update(cases::changes(&before, &after));
        check(&case, "iptables.update", &update, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn t10_an_update_equals_a_full_sync_of_the_result() {
    // Applying the update to the full text must give what a full sync of the new state gives:
    // compared as the set of elements (nft) and chains (iptables) each describes.
    for case in cases::all() {
        let before = case.desired();
        let after = case.desired_after_update();
        let mut incremental = NftRules::new(case.node.clone());
        incremental.full(before.iter().map(|(k, v)| (k, v.as_slice())), &[]);
        incremental.update(cases::changes(&before, &after));
        let mut fresh = NftRules::new(case.node.clone());
        let expected = fresh.full(after.iter().map(|(k, v)| (k, v.as_slice())), &[]);
        assert_eq!(incremental.render(&[]), expected, "{}", case.name);

        let mut incremental = IptablesRules::new(case.node.clone());
        incremental.full(before.iter().map(|(k, v)| (k, v.as_slice())), "");
        incremental.update(cases::changes(&before, &after));
        let mut fresh = IptablesRules::new(case.node.clone());
        let expected = fresh.full(after.iter().map(|(k, v)| (k, v.as_slice())), "");
        assert_eq!(incremental.render(""), expected, "{}", case.name);
    }
}

#[test]
fn t10_two_services_claiming_one_address_never_fail_the_transaction() {
    // An externalIP both Services list: the first in key order owns the elements; when it goes,
    // the other takes them over in the same update (a delete and an add, never a duplicate add).
    let node = cases::all().remove(0).node;
    let service = |name: &str, cip: &str, ep: &str| {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"clusterIP": cip, "externalIPs": ["203.0.113.9"], "ports": [{"port": 80}]},
        }))
        .unwrap();
        let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "default", "name": name, "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": [{"addresses": [ep]}],
        }))
        .unwrap();
        (svc, slice)
    };
    let (a, a_slice) = service("a", "10.96.0.1", "10.244.2.1");
    let (b, b_slice) = service("b", "10.96.0.2", "10.244.2.2");
    let both =
        gitplane_nodeagent::network::proxy::desired::desired(&node, &[a, b.clone()], &[a_slice, b_slice.clone()]);
    let mut nft = NftRules::new(node.clone());
    let full = nft.full(both.iter().map(|(k, v)| (k, v.as_slice())), &[]);
    assert_eq!(full.matches("203.0.113.9 . tcp . 80 . 0 : ").count(), 1, "{full}");
    assert!(full.contains("203.0.113.9 . tcp . 80 . 0 : 10.244.2.1 . 8080"), "{full}");

    let only_b = gitplane_nodeagent::network::proxy::desired::desired(&node, &[b], &[b_slice]);
    let (update, _) = nft.update(cases::changes(&both, &only_b));
    assert!(update.contains("delete element ip gitplane-proxy endpoints { 203.0.113.9 . tcp . 80 . 0 }"), "{update}");
    assert!(
        update.contains("add element ip gitplane-proxy endpoints { 203.0.113.9 . tcp . 80 . 0 : 10.244.2.2 . 8080 }"),
        "{update}"
    );
}
