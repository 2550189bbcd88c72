//! What kube-apiserver refuses of a NetworkPolicy beyond its schema (`ValidateNetworkPolicySpec`):
//! peers that name nothing or mix an ipBlock with selectors, CIDRs that do not parse, an
//! `except` outside its `cidr`, ports out of range or not a port name, `endPort` without a
//! numeric `port` or below it, unknown protocols and policy types.

use super::Problem;
use serde_json::Value;
use std::net::IpAddr;

pub(super) fn problems(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let spec = &value["spec"];
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in items(&spec[direction]) {
            let at = format!("/spec/{direction}/{i}");
            for (j, peer) in items(&rule[peers]) {
                peer_problems(peer, &format!("{at}/{peers}/{j}"), &mut problems);
            }
            for (j, port) in items(&rule["ports"]) {
                port_problems(port, &format!("{at}/ports/{j}"), &mut problems);
            }
        }
    }
    let types = items(&spec["policyTypes"]).collect::<Vec<_>>();
    for (i, t) in &types {
        if !matches!(t.as_str(), Some("Ingress" | "Egress")) {
            problems.push(Problem::at(
                format!("/spec/policyTypes/{i}"),
                format!("Unsupported value: {t}: supported values: \"Ingress\", \"Egress\""),
            ));
        }
    }
    if types.len() > 2 {
        problems.push(Problem::at("/spec/policyTypes", "may not have more than 2 items (Ingress, Egress)"));
    }
    problems
}

fn items(list: &Value) -> impl Iterator<Item = (usize, &Value)> {
    list.as_array().into_iter().flatten().enumerate()
}

fn peer_problems(peer: &Value, at: &str, problems: &mut Vec<Problem>) {
    let set = |field: &str| !peer[field].is_null();
    let selectors = usize::from(set("podSelector")) + usize::from(set("namespaceSelector"));
    if set("ipBlock") {
        if selectors > 0 {
            problems.push(Problem::at(
                at,
                "may not specify more than 1 peer type: an ipBlock stands alone (write the selectors as another peer)",
            ));
        }
        ip_block_problems(&peer["ipBlock"], &format!("{at}/ipBlock"), problems);
    } else if selectors == 0 {
        problems.push(Problem::at(
            at,
            "must specify a peer: podSelector, namespaceSelector or ipBlock (an empty peer matches nothing)",
        ));
    }
}

fn ip_block_problems(block: &Value, at: &str, problems: &mut Vec<Problem>) {
    let Some(text) = block["cidr"].as_str() else {
        problems.push(Problem::at(format!("{at}/cidr"), "Required value: an ipBlock needs a cidr"));
        return;
    };
    let cidr = match parse_cidr(text) {
        Ok(cidr) => Some(cidr),
        Err(why) => {
            problems.push(Problem::at(format!("{at}/cidr"), format!("Invalid value: {text:?}: {why}")));
            None
        }
    };
    for (i, except) in items(&block["except"]) {
        let pointer = format!("{at}/except/{i}");
        let Some(except_text) = except.as_str() else { continue }; // the schema's error
        match (parse_cidr(except_text), cidr) {
            (Err(why), _) => problems.push(Problem::at(pointer, format!("Invalid value: {except_text:?}: {why}"))),
            (Ok(e), Some(c)) if !(contains(c, e.0) && c.1 < e.1) => problems.push(Problem::at(
                pointer,
                format!("Invalid value: {except_text:?}: must be a strict subset of `cidr` ({text})"),
            )),
            _ => {}
        }
    }
}

/// An address and prefix length, as Go's `net.ParseCIDR` reads them (host bits may be set).
fn parse_cidr(text: &str) -> Result<(IpAddr, u8), String> {
    const HOW: &str = "must be a CIDR, an IP address and a prefix length, e.g. 10.0.0.0/16 or fd00::/64";
    let (address, prefix) = text.split_once('/').ok_or_else(|| HOW.to_owned())?;
    let address: IpAddr = address.parse().map_err(|_| HOW.to_owned())?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    match prefix.parse::<u8>() {
        Ok(p) if p <= max && !prefix.starts_with('+') && (prefix == "0" || !prefix.starts_with('0')) => {
            Ok((address, p))
        }
        _ => Err(format!("the prefix length must be 0-{max}: {HOW}")),
    }
}

/// Whether `address` is inside the network `cidr`.
fn contains((network, prefix): (IpAddr, u8), address: IpAddr) -> bool {
    match (network, address) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

fn port_problems(port: &Value, at: &str, problems: &mut Vec<Problem>) {
    if let Some(protocol) = port["protocol"].as_str()
        && !matches!(protocol, "TCP" | "UDP" | "SCTP")
    {
        problems.push(Problem::at(
            format!("{at}/protocol"),
            format!("Unsupported value: {protocol:?}: supported values: \"TCP\", \"UDP\", \"SCTP\""),
        ));
    }
    let number = match &port["port"] {
        Value::Number(n) => match n.as_i64() {
            Some(n @ 1..=65535) => Some(n),
            _ => {
                problems.push(Problem::at(
                    format!("{at}/port"),
                    format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
                ));
                None
            }
        },
        Value::String(name) => {
            if let Err(why) = port_name(name) {
                problems.push(Problem::at(format!("{at}/port"), format!("Invalid value: {name:?}: {why}")));
            }
            None
        }
        _ => None,
    };
    let Some(end) = port["endPort"].as_i64() else { return };
    let pointer = format!("{at}/endPort");
    match &port["port"] {
        Value::Null => problems.push(Problem::at(pointer, "may not be specified when `port` is not specified")),
        Value::String(_) => problems.push(Problem::at(pointer, "may not be specified when `port` is non-numeric")),
        _ => {
            if !(1..=65535).contains(&end) {
                problems.push(Problem::at(
                    pointer,
                    format!("Invalid value: {end}: must be between 1 and 65535, inclusive"),
                ));
            } else if let Some(start) = number
                && end < start
            {
                problems.push(Problem::at(
                    pointer,
                    format!("Invalid value: {end}: must be greater than or equal to `port` ({start})"),
                ));
            }
        }
    }
}

/// An IANA service name, as a container port's name (Kubernetes' `IsValidPortName`).
fn port_name(name: &str) -> Result<(), &'static str> {
    let valid = !name.is_empty()
        && name.len() <= 15
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if valid {
        Ok(())
    } else {
        Err(
            "a port name must be at most 15 lowercase letters, digits and '-', contain a letter, and neither begin, end nor have two '-' in a row",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(spec: Value) -> Vec<(String, String)> {
        problems(&json!({"spec": spec})).into_iter().map(|p| (p.pointer.unwrap_or_default(), p.message)).collect()
    }

    #[test]
    fn kube_apiserver_refusals() {
        let cases = [
            (
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
                "/spec/ingress/0/from/0/ipBlock/cidr",
                "prefix length",
            ),
            (
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0/8"}}]}]}),
                "/spec/ingress/0/from/0/ipBlock/cidr",
                "must be a CIDR",
            ),
            (
                json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}]}),
                "/spec/egress/0/to/0/ipBlock/except/0",
                "strict subset",
            ),
            (
                json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16"]}}]}]}),
                "/spec/egress/0/to/0/ipBlock/except/0",
                "strict subset",
            ),
            (
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
                "/spec/ingress/0/from/0",
                "more than 1 peer",
            ),
            (json!({"ingress": [{"from": [{}]}]}), "/spec/ingress/0/from/0", "must specify a peer"),
            (
                json!({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
                "/spec/ingress/0/ports/0/endPort",
                "greater than or equal",
            ),
            (
                json!({"ingress": [{"ports": [{"port": "http", "endPort": 80}]}]}),
                "/spec/ingress/0/ports/0/endPort",
                "non-numeric",
            ),
            (json!({"ingress": [{"ports": [{"endPort": 80}]}]}), "/spec/ingress/0/ports/0/endPort", "not specified"),
            (json!({"ingress": [{"ports": [{"port": 0}]}]}), "/spec/ingress/0/ports/0/port", "between 1 and 65535"),
            (json!({"ingress": [{"ports": [{"port": "Web_1"}]}]}), "/spec/ingress/0/ports/0/port", "port name"),
            (
                json!({"ingress": [{"ports": [{"protocol": "ICMP"}]}]}),
                "/spec/ingress/0/ports/0/protocol",
                "Unsupported value",
            ),
            (json!({"policyTypes": ["Ingress", "Outbound"]}), "/spec/policyTypes/1", "Unsupported value"),
        ];
        for (spec, path, says) in cases {
            let got = messages(spec.clone());
            assert!(got.len() == 1 && got[0].0 == path && got[0].1.contains(says), "{spec}: {got:?}");
        }
    }

    #[test]
    fn what_kube_accepts_passes() {
        let spec = json!({
            "podSelector": {}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}},
                                  {"ipBlock": {"cidr": "10.0.0.1/16", "except": ["10.0.1.0/24"]}},
                                  {"ipBlock": {"cidr": "fd00::/64"}}],
                         "ports": [{"port": 80, "endPort": 90}, {"port": "http", "protocol": "UDP"}, {"protocol": "SCTP"}]}],
            "egress": [{}]
        });
        assert_eq!(messages(spec), []);
    }
}
