//! What the agent contract's certificates say, and the little of X.509 both sides read: the
//! subject of a certificate (who a verified peer is) and the parts of a PKCS#10 request (its
//! public key and signature). A DER reader of its own rather than an X.509 crate: it reads
//! three fields, and the agent links no parser this way.
//!
//! Names follow Kubernetes: a node is user `system:node:<name>` in group `system:nodes`; the
//! control plane's replicas are group `gitplane:replicas` (they present that certificate to each
//! other and to the kubelet endpoints, as kube-apiserver's `--kubelet-client-certificate`).

use base64::Engine as _;

/// A node's user name is this prefix and the node's name (the CN of its certificates).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group (O) of every node's certificates.
pub const NODES_GROUP: &str = "system:nodes";
/// The group (O) of the replicas' certificates.
pub const REPLICAS_GROUP: &str = "gitplane:replicas";

/// The subject of a certificate: its common name and organizations, and the UID attribute
/// (LDAP `uid`, 0.9.2342.19200300.100.1.1) in which a node's certificates carry the uid of the
/// Node object they were issued for: a Node removed and registered again is another Node, and
/// the certificates of the first no longer name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    pub uid: Option<String>,
}

impl Subject {
    /// The node a certificate names (`system:node:<name>` in `system:nodes`), if any.
    pub fn node(&self) -> Option<&str> {
        if !self.organizations.iter().any(|o| o == NODES_GROUP) {
            return None;
        }
        self.common_name.as_deref()?.strip_prefix(NODE_USER_PREFIX).filter(|n| !n.is_empty())
    }

    /// Whether a certificate is a replica's.
    pub fn is_replica(&self) -> bool {
        self.organizations.iter().any(|o| o == REPLICAS_GROUP)
    }
}

/// One DER element: its tag, its content and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        (rest[..n].iter().fold(0usize, |len, b| len << 8 | usize::from(*b)), &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The element of `tag` at the start of `input`, and what follows it.
fn expect(tag: u8, input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (found, content, rest) = element(input)?;
    (found == tag).then_some((content, rest))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const BIT_STRING: u8 = 0x03;
const INTEGER: u8 = 0x02;
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
/// 0.9.2342.19200300.100.1.1, the `uid` attribute (RFC 4519).
pub const OID_UID: &[u64] = &[0, 9, 2342, 19_200_300, 100, 1, 1];
const OID_UID_DER: &[u8] = &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01];
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// A Name's content (RDNSequence): its CN and Os.
fn name(mut rdns: &[u8]) -> Option<Subject> {
    let mut subject = Subject::default();
    while !rdns.is_empty() {
        let (mut set, rest) = expect(SET, rdns)?;
        rdns = rest;
        while !set.is_empty() {
            let (attribute, rest) = expect(SEQUENCE, set)?;
            set = rest;
            let (oid, value) = expect(OID, attribute)?;
            let (_, value, _) = element(value)?;
            let value = std::str::from_utf8(value).ok()?.to_owned();
            match oid {
                OID_COMMON_NAME => subject.common_name = Some(value),
                OID_ORGANIZATION => subject.organizations.push(value),
                OID_UID_DER => subject.uid = Some(value),
                _ => {}
            }
        }
    }
    Some(subject)
}

/// The subject of a DER certificate; `None` if it is not one.
pub fn subject(certificate: &[u8]) -> Option<Subject> {
    let (certificate, _) = expect(SEQUENCE, certificate)?;
    let (tbs, _) = expect(SEQUENCE, certificate)?;
    let (tag, _, rest) = element(tbs)?;
    // The explicit version ([0]) is optional; the serial number follows it.
    let rest = if tag == 0xa0 { expect(INTEGER, rest)?.1 } else { rest };
    let (_signature, rest) = expect(SEQUENCE, rest)?;
    let (_issuer, rest) = expect(SEQUENCE, rest)?;
    let (_validity, rest) = expect(SEQUENCE, rest)?;
    let (subject, _) = expect(SEQUENCE, rest)?;
    name(subject)
}

/// When a DER certificate becomes valid and when it expires (its notBefore and notAfter);
/// `None` if it is not a certificate.
pub fn validity(certificate: &[u8]) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let (certificate, _) = expect(SEQUENCE, certificate)?;
    let (tbs, _) = expect(SEQUENCE, certificate)?;
    let (tag, _, rest) = element(tbs)?;
    let rest = if tag == 0xa0 { expect(INTEGER, rest)?.1 } else { rest };
    let (_signature, rest) = expect(SEQUENCE, rest)?;
    let (_issuer, rest) = expect(SEQUENCE, rest)?;
    let (validity, _) = expect(SEQUENCE, rest)?;
    let (not_before, rest) = time(validity)?;
    let (not_after, _) = time(rest)?;
    Some((not_before, not_after))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`), as
/// RFC 5280 has certificates write them, and what follows it.
fn time(input: &[u8]) -> Option<(std::time::SystemTime, &[u8])> {
    let (tag, content, rest) = element(input)?;
    let digits = content.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |d: &[u8]| d.iter().fold(0i64, |n, b| n * 10 + i64::from(b - b'0'));
    let (year, rest_digits) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = number(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (number(&digits[..4]), &digits[4..]),
        _ => return None,
    };
    let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|i| number(&rest_digits[i..i + 2]));
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let since_epoch = std::time::Duration::from_secs(u64::try_from(seconds).ok()?);
    Some((std::time::UNIX_EPOCH + since_epoch, rest))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The parts of a PKCS#10 certification request that signing one needs.
#[derive(Debug, PartialEq, Eq)]
pub struct CertificationRequest<'a> {
    /// The signed part, whole (tag and length included).
    pub info: &'a [u8],
    /// The content of the key's AlgorithmIdentifier, and the key (the BIT STRING's bits).
    pub public_key_algorithm: &'a [u8],
    pub public_key: &'a [u8],
    /// The content of the signature's AlgorithmIdentifier, and the signature.
    pub signature_algorithm: &'a [u8],
    pub signature: &'a [u8],
}

/// A BIT STRING's bits, whole bytes only (keys and signatures are).
fn bits(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (content, rest) = expect(BIT_STRING, input)?;
    let (&unused, bits) = content.split_first()?;
    (unused == 0).then_some((bits, rest))
}

/// Reads a DER PKCS#10 request; `None` if it is not one.
pub fn certification_request(der: &[u8]) -> Option<CertificationRequest<'_>> {
    let (request, trailing) = expect(SEQUENCE, der)?;
    if !trailing.is_empty() {
        return None;
    }
    let (info_content, after_info) = expect(SEQUENCE, request)?;
    let info = &request[..request.len() - after_info.len()];
    let (_version, rest) = expect(INTEGER, info_content)?;
    let (_subject, rest) = expect(SEQUENCE, rest)?;
    let (spki, _attributes) = expect(SEQUENCE, rest)?;
    let (public_key_algorithm, rest) = expect(SEQUENCE, spki)?;
    let (public_key, _) = bits(rest)?;
    let (signature_algorithm, rest) = expect(SEQUENCE, after_info)?;
    let (signature, rest) = bits(rest)?;
    rest.is_empty().then_some(CertificationRequest {
        info,
        public_key_algorithm,
        public_key,
        signature_algorithm,
        signature,
    })
}

/// `der` as PEM with `label` (`CERTIFICATE`, `PRIVATE KEY`).
pub fn pem(label: &str, der: &[u8]) -> String {
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = text.as_bytes().chunks(64).map(|l| std::str::from_utf8(l).unwrap_or_default()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

/// Every PEM block of `text` with `label`, decoded; blocks that do not decode are skipped.
pub fn pem_blocks(text: &str, label: &str) -> Vec<Vec<u8>> {
    let (begin, end) = (format!("-----BEGIN {label}-----"), format!("-----END {label}-----"));
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let body = &rest[start + begin.len()..];
        let Some(stop) = body.find(&end) else { break };
        let b64: String = body[..stop].chars().filter(|c| !c.is_whitespace()).collect();
        if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64) {
            blocks.push(der);
        }
        rest = &body[stop + end.len()..];
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lengths_and_refuses_short_input() {
        assert_eq!(element(&[0x30, 0x01, 0x05, 0xff]), Some((0x30, &[0x05][..], &[0xff][..])));
        let long = [&[0x04, 0x81, 0x80][..], &[0u8; 0x80]].concat();
        assert_eq!(element(&long).map(|(_, c, r)| (c.len(), r.len())), Some((0x80, 0)));
        for bad in [&[][..], &[0x30], &[0x30, 0x02, 0x00], &[0x30, 0x80], &[0x30, 0x85, 1, 1, 1, 1, 1]] {
            assert_eq!(element(bad), None, "{bad:?}");
        }
        assert_eq!(subject(&[0x30, 0x03, 0x30, 0x01, 0x00]), None);
        assert_eq!(certification_request(b"not DER"), None);
    }

    #[test]
    fn node_and_replica_subjects() {
        let node =
            Subject { common_name: Some("system:node:n1".into()), organizations: vec![NODES_GROUP.into()], uid: None };
        assert_eq!(node.node(), Some("n1"));
        assert!(!node.is_replica());
        let no_group = Subject { organizations: vec![], ..node.clone() };
        assert_eq!(no_group.node(), None);
        let empty = Subject { common_name: Some("system:node:".into()), ..node };
        assert_eq!(empty.node(), None);
        let replica = Subject {
            common_name: Some("gitplane replica".into()),
            organizations: vec![REPLICAS_GROUP.into()],
            uid: None,
        };
        assert!(replica.is_replica() && replica.node().is_none());
    }

    #[test]
    fn reads_both_time_forms() {
        let at = |tag: u8, text: &str| {
            let der = [&[tag, text.len() as u8][..], text.as_bytes()].concat();
            time(&der).map(|(t, _)| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs())
        };
        assert_eq!(at(UTC_TIME, "700101000000Z"), Some(0));
        assert_eq!(at(UTC_TIME, "261204182900Z"), Some(1_796_408_940));
        assert_eq!(at(GENERALIZED_TIME, "20261204182900Z"), Some(1_796_408_940));
        assert_eq!(at(GENERALIZED_TIME, "20000229235960Z"), Some(951_868_800));
        for bad in ["2612041829Z", "261304182900Z", "26120418290aZ", "261204182900"] {
            assert_eq!(at(UTC_TIME, bad), None, "{bad}");
        }
    }

    #[test]
    fn pem_round_trips() {
        let der = (0..200u8).collect::<Vec<_>>();
        let text = format!("junk\n{}{}", pem("CERTIFICATE", &der), pem("PRIVATE KEY", &[1, 2, 3]));
        assert!(text.lines().all(|l| l.len() <= 64));
        assert_eq!(pem_blocks(&text, "CERTIFICATE"), vec![der]);
        assert_eq!(pem_blocks(&text, "PRIVATE KEY"), vec![vec![1, 2, 3]]);
    }
}
