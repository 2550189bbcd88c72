//! One request in, one response (or a forward to carry out) out: the server's decisions,
//! without sockets. Only this module and `server` see DNS messages as bytes, and only through
//! hickory-proto's codec.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{
    Edns, Header, Message, MessageType, Metadata, OpCode, Query, ResponseCode, emit_message_parts,
};
use hickory_proto::rr::{DNSClass, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncoder};

use super::forward::Forwarding;
use super::records::{Lookup, Zone};

/// The largest UDP response we send (DNS flag day 2020), whatever a client offers.
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// ExternalName Services may point at each other; stop following after this many.
const MAX_ALIASES: usize = 8;
/// A UDP answer to a client refused recursion is at most this many times the size of its query;
/// a larger one is truncated (TC) and the client asks again over TCP, whose handshake a spoofed
/// source cannot complete. So a query sent in a victim's name gets the victim at most 3 bytes
/// per byte sent (an NXDOMAIN with its SOA, for a short name: the most the zone answered
/// anyone before recursion was refused), whatever the zone holds.
pub const MAX_AMPLIFICATION: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Whether names outside the cluster are resolved for a client (BIND's `allow-recursion`):
/// cluster names are answered to anyone, other names only to the node and its Pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recursion {
    Allowed,
    /// REFUSED for names outside the cluster (an ExternalName's CNAME is answered, its target
    /// not chased), RA clear, and UDP answers within [`MAX_AMPLIFICATION`].
    Refused,
}

/// What to do with one received packet.
pub enum Outcome {
    Reply(Vec<u8>),
    /// Ask an upstream server, then `Pending::finish` builds the reply.
    Forward(Box<Pending>),
    /// Not a query we answer (too short to carry an id, or a response): say nothing, so
    /// spoofed responses cannot make us reflect traffic.
    Drop,
}

/// A query to forward, with what the reply to the client needs.
#[derive(Debug)]
pub struct Pending {
    request: Message,
    question: Query,
    /// The CNAMEs of ExternalName Services already followed, answered ahead of upstream data.
    aliases: Vec<Record>,
    max_size: u16,
    pub upstreams: Arc<[SocketAddr]>,
    pub transport: Transport,
}

impl Pending {
    /// The question asked upstream: the client's, or the target of an ExternalName.
    pub fn question(&self) -> &Query {
        &self.question
    }

    /// The query to send upstream under a fresh `id`.
    pub fn upstream_query(&self, id: u16) -> Vec<u8> {
        let mut query = Message::new(id, MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        query.metadata.checking_disabled = self.request.checking_disabled;
        query.add_query(self.question.clone());
        if let Some(client) = &self.request.edns {
            let mut edns = Edns::new();
            edns.set_max_payload(MAX_UDP_PAYLOAD);
            edns.set_dnssec_ok(client.flags().dnssec_ok);
            query.set_edns(edns);
        }
        encode(&query, u16::MAX)
    }

    /// Whether `response` answers the query sent under `id` (anything else is ignored, so an
    /// off-path sender must guess the id, the port and the question).
    pub fn accepts(&self, id: u16, response: &Message) -> bool {
        response.id == id
            && response.message_type == MessageType::Response
            && matches!(response.queries.as_slice(), [q] if q.query_type() == self.question.query_type()
                && q.query_class() == self.question.query_class()
                && q.name().eq_ignore_root(self.question.name()))
    }

    /// The client's reply from the upstream's answer; `None` (no usable answer) is SERVFAIL.
    pub fn finish(&self, upstream: Option<Message>) -> Vec<u8> {
        let Some(mut upstream) = upstream else { return self.error(ResponseCode::ServFail) };
        let mut response = response_to(&self.request, Recursion::Allowed);
        response.metadata.response_code = upstream.response_code;
        response.metadata.truncation = upstream.truncation;
        response.answers = self.aliases.clone();
        response.answers.append(&mut upstream.answers);
        response.authorities = upstream.authorities;
        response.additionals = upstream.additionals;
        encode(&response, self.max_size)
    }

    /// REFUSED, when too many queries are already waiting for upstream servers.
    pub fn refused(&self) -> Vec<u8> {
        self.error(ResponseCode::Refused)
    }

    fn error(&self, code: ResponseCode) -> Vec<u8> {
        let mut response = response_to(&self.request, Recursion::Allowed);
        response.metadata.response_code = code;
        encode(&response, self.max_size)
    }
}

/// Decides the answer to one packet from the zone and the forwarding table.
pub fn respond(
    zone: &Zone,
    forwarding: &Forwarding,
    packet: &[u8],
    transport: Transport,
    recursion: Recursion,
) -> Outcome {
    let Ok(header) = Header::read(&mut BinDecoder::new(packet)) else { return Outcome::Drop };
    if header.message_type != MessageType::Query {
        return Outcome::Drop;
    }
    let request = match Message::from_vec(packet) {
        Ok(request) => request,
        Err(_) => return Outcome::Reply(header_only(&header.metadata, ResponseCode::FormErr)),
    };
    let max_size = match (transport, recursion) {
        (Transport::Tcp, _) => u16::MAX,
        (Transport::Udp, Recursion::Allowed) => request.max_payload().min(MAX_UDP_PAYLOAD),
        (Transport::Udp, Recursion::Refused) => {
            let bound = u16::try_from(packet.len().saturating_mul(MAX_AMPLIFICATION)).unwrap_or(u16::MAX);
            request.max_payload().min(MAX_UDP_PAYLOAD).min(bound)
        }
    };
    let error = |code| {
        let mut response = response_to(&request, recursion);
        response.metadata.response_code = code;
        Outcome::Reply(encode(&response, max_size))
    };
    if request.op_code != OpCode::Query {
        return error(ResponseCode::NotImp);
    }
    let [query] = request.queries.as_slice() else { return error(ResponseCode::FormErr) };
    if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
        return error(ResponseCode::BADVERS);
    }
    // The zone is computed, not stored: there is nothing to transfer.
    if query.query_class() != DNSClass::IN || matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
        return error(ResponseCode::Refused);
    }
    let qtype = query.query_type();
    let mut aliases = Vec::new();
    let mut name = query.name().clone();
    for _ in 0..=MAX_ALIASES {
        let mut response = response_to(&request, recursion);
        response.metadata.authoritative = aliases.is_empty();
        response.answers = aliases;
        match zone.lookup(&name, qtype) {
            Lookup::Found { mut answers, additionals } => {
                response.answers.append(&mut answers);
                response.additionals = additionals;
            }
            Lookup::NoData { soa } => response.authorities.push(soa),
            Lookup::NxDomain { soa } => {
                response.metadata.response_code = ResponseCode::NXDomain;
                response.authorities.push(soa);
            }
            Lookup::Alias { cname, target } => {
                aliases = std::mem::take(&mut response.answers);
                aliases.push(cname);
                name = target;
                continue;
            }
            // Not ours to answer, and not to be asked elsewhere for this client: what the zone
            // said (an ExternalName's CNAME) stands alone, or the query is refused.
            Lookup::Foreign if recursion == Recursion::Refused => {
                if response.answers.is_empty() {
                    response.metadata.response_code = ResponseCode::Refused;
                }
            }
            Lookup::Foreign => {
                let upstreams = forwarding.upstreams_for(&name);
                if upstreams.is_empty() {
                    response.metadata.response_code = ResponseCode::ServFail;
                    return Outcome::Reply(encode(&response, max_size));
                }
                let question = Query::query(name, qtype);
                let aliases = std::mem::take(&mut response.answers);
                return Outcome::Forward(Box::new(Pending {
                    request,
                    question,
                    aliases,
                    max_size,
                    upstreams,
                    transport,
                }));
            }
        }
        return Outcome::Reply(encode(&response, max_size));
    }
    error(ResponseCode::ServFail)
}

/// A response to `request` without records: its id, question, RD and CD bits, RA when the
/// client may have recursion, and an OPT record when the client sent one.
fn response_to(request: &Message, recursion: Recursion) -> Message {
    let mut response = Message::new(request.id, MessageType::Response, request.op_code);
    response.metadata = Metadata::response_from_request(&request.metadata);
    response.metadata.recursion_available = recursion == Recursion::Allowed;
    response.queries = request.queries.clone();
    if let Some(client) = &request.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        edns.set_dnssec_ok(client.flags().dnssec_ok);
        response.set_edns(edns);
    }
    response
}

/// A bare header for a request whose body cannot be parsed (no question to echo).
fn header_only(request: &Metadata, code: ResponseCode) -> Vec<u8> {
    let mut response = Message::new(request.id, MessageType::Response, request.op_code);
    response.metadata.recursion_desired = request.recursion_desired;
    response.metadata.response_code = code;
    encode(&response, u16::MAX)
}

/// Encodes within `max_size`; what does not fit is sent as question + OPT with TC set, so the
/// client retries over TCP (partial answers would look complete to some stub resolvers).
pub(crate) fn encode(message: &Message, max_size: u16) -> Vec<u8> {
    let mut buf = Vec::with_capacity(512);
    if emit(message, max_size, &mut buf).is_some_and(|truncated| !truncated) {
        return buf;
    }
    buf.clear();
    if emit(&message.truncate(), max_size, &mut buf).is_some() {
        return buf;
    }
    // Only a question too long for the limit gets here; a header alone always fits.
    buf.clear();
    let mut bare = Message::new(message.id, MessageType::Response, message.op_code);
    bare.metadata.truncation = true;
    emit(&bare, u16::MAX, &mut buf);
    buf
}

/// Some(truncated) when encoded, None on an encoding error.
fn emit(message: &Message, max_size: u16, buf: &mut Vec<u8>) -> Option<bool> {
    let mut encoder = BinEncoder::new(buf);
    encoder.set_max_size(max_size);
    let header = emit_message_parts(
        &message.metadata,
        &mut message.queries.iter(),
        &mut message.answers.iter(),
        &mut message.authorities.iter(),
        &mut message.additionals.iter(),
        message.edns.as_ref(),
        None,
        &mut encoder,
    )
    .ok()?;
    Some(header.truncation && !message.truncation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::dns::records::ZoneConfig;
    use hickory_proto::rr::Name;

    fn zone() -> Zone {
        let mut zone = Zone::new(ZoneConfig::default()).unwrap();
        let svc = |name: &str, spec: serde_json::Value| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec}))
                .unwrap()
        };
        zone.apply_service(&svc("web", serde_json::json!({"clusterIP": "10.96.0.20"}))).unwrap();
        zone.apply_service(&svc("ext", serde_json::json!({"type": "ExternalName", "externalName": "www.example.com"})))
            .unwrap();
        zone.apply_service(&svc(
            "alias",
            serde_json::json!({"type": "ExternalName", "externalName": "web.ns.svc.cluster.local"}),
        ))
        .unwrap();
        zone.apply_service(&svc(
            "loop",
            serde_json::json!({"type": "ExternalName", "externalName": "loop.ns.svc.cluster.local"}),
        ))
        .unwrap();
        zone.apply_service(&svc("big", serde_json::json!({"clusterIP": "None"}))).unwrap();
        let endpoints: Vec<_> = (0..200)
            .map(|i| serde_json::json!({"addresses": [format!("10.244.{}.{}", i / 250, i % 250 + 1)]}))
            .collect();
        let slice = serde_json::json!({"metadata": {"namespace": "ns", "name": "big-1", "labels": {"kubernetes.io/service-name": "big"}},
            "addressType": "IPv4", "endpoints": endpoints});
        zone.apply_slice(&serde_json::from_value(slice).unwrap()).unwrap();
        zone
    }

    fn forwarding() -> Forwarding {
        Forwarding::new(vec!["192.0.2.53:53".parse().unwrap()])
    }

    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Message {
        let mut q = Message::new(0x1234, MessageType::Query, OpCode::Query);
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(payload) = edns {
            let mut e = Edns::new();
            e.set_max_payload(payload);
            q.set_edns(e);
        }
        q
    }

    fn ask(msg: &Message, transport: Transport) -> Outcome {
        respond(&zone(), &forwarding(), &msg.to_vec().unwrap(), transport, Recursion::Allowed)
    }

    fn reply(outcome: Outcome) -> (Message, usize) {
        match outcome {
            Outcome::Reply(bytes) => (Message::from_vec(&bytes).unwrap(), bytes.len()),
            Outcome::Forward(p) => panic!("forwarded {:?}", p.question()),
            Outcome::Drop => panic!("dropped"),
        }
    }

    #[test]
    fn t10_answers_carry_the_request_id_flags_and_edns() {
        let (r, _) = reply(ask(&query("web.ns.svc.cluster.local.", RecordType::A, Some(4096)), Transport::Udp));
        assert_eq!((r.id, r.message_type, r.response_code), (0x1234, MessageType::Response, ResponseCode::NoError));
        assert!(r.authoritative && r.recursion_desired && r.recursion_available && !r.truncation);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(r.edns.as_ref().map(Edns::max_payload), Some(MAX_UDP_PAYLOAD));
        let (r, _) = reply(ask(&query("nope.ns.svc.cluster.local.", RecordType::A, None), Transport::Udp));
        assert_eq!(r.response_code, ResponseCode::NXDomain);
        assert!(r.edns.is_none() && r.authorities[0].record_type() == RecordType::SOA);
    }

    #[test]
    fn t10_large_answers_truncate_over_udp_only() {
        let q = query("big.ns.svc.cluster.local.", RecordType::A, None);
        let (r, len) = reply(ask(&q, Transport::Udp));
        assert!(r.truncation && r.answers.is_empty() && len <= 512, "TC, question only");
        let (r, _) = reply(ask(&query("big.ns.svc.cluster.local.", RecordType::A, Some(4096)), Transport::Udp));
        assert!(r.truncation, "200 records do not fit in 1232 bytes either");
        let (r, _) = reply(ask(&q, Transport::Tcp));
        assert!(!r.truncation);
        assert_eq!(r.answers.len(), 200);
    }

    #[test]
    fn t10_external_names_are_followed() {
        let (r, _) = reply(ask(&query("alias.ns.svc.cluster.local.", RecordType::A, None), Transport::Udp));
        let shown: Vec<String> = r.answers.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "alias.ns.svc.cluster.local. 5 IN CNAME web.ns.svc.cluster.local.",
                "web.ns.svc.cluster.local. 5 IN A 10.96.0.20",
            ]
        );
        let (r, _) = reply(ask(&query("loop.ns.svc.cluster.local.", RecordType::A, None), Transport::Udp));
        assert_eq!(r.response_code, ResponseCode::ServFail, "a CNAME loop ends");

        let Outcome::Forward(pending) =
            ask(&query("ext.ns.svc.cluster.local.", RecordType::A, Some(1232)), Transport::Udp)
        else {
            panic!("an outside target is forwarded")
        };
        assert_eq!(pending.question().name().to_string(), "www.example.com.");
        let sent = Message::from_vec(&pending.upstream_query(7)).unwrap();
        assert_eq!((sent.id, sent.recursion_desired, sent.queries.len()), (7, true, 1));
        let mut upstream = Message::new(7, MessageType::Response, OpCode::Query);
        upstream.add_query(sent.queries[0].clone());
        upstream.add_answer(Record::from_rdata(
            Name::from_ascii("www.example.com.").unwrap(),
            60,
            hickory_proto::rr::RData::A("192.0.2.1".parse().unwrap()),
        ));
        assert!(pending.accepts(7, &upstream) && !pending.accepts(8, &upstream));
        let r = Message::from_vec(&pending.finish(Some(upstream))).unwrap();
        let shown: Vec<String> = r.answers.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["ext.ns.svc.cluster.local. 5 IN CNAME www.example.com.", "www.example.com. 60 IN A 192.0.2.1"]
        );
        assert_eq!((r.id, r.queries[0].name().to_string()), (0x1234, "ext.ns.svc.cluster.local.".to_string()));
        let r = Message::from_vec(&pending.finish(None)).unwrap();
        assert_eq!(r.response_code, ResponseCode::ServFail);
    }

    #[test]
    fn t10_requests_answered_with_errors() {
        let code = |msg: &Message| reply(ask(msg, Transport::Udp)).0.response_code;
        let mut two = query("web.ns.svc.cluster.local.", RecordType::A, None);
        two.add_query(Query::query(Name::from_ascii("x.").unwrap(), RecordType::A));
        assert_eq!(code(&two), ResponseCode::FormErr);
        let mut none = query("web.ns.svc.cluster.local.", RecordType::A, None);
        none.queries.clear();
        assert_eq!(code(&none), ResponseCode::FormErr);
        let mut notify = query("web.ns.svc.cluster.local.", RecordType::SOA, None);
        notify.metadata.op_code = OpCode::Notify;
        assert_eq!(code(&notify), ResponseCode::NotImp);
        assert_eq!(code(&query("cluster.local.", RecordType::AXFR, None)), ResponseCode::Refused);
        let mut chaos = query("version.bind.", RecordType::TXT, None);
        chaos.queries[0].set_query_class(DNSClass::CH);
        assert_eq!(code(&chaos), ResponseCode::Refused);
        let mut v1 = query("web.ns.svc.cluster.local.", RecordType::A, Some(1232));
        v1.edns.as_mut().unwrap().set_version(1);
        // 16 on the wire, which hickory decodes as BADSIG (the same code in TSIG's registry).
        let badvers = code(&v1);
        assert_eq!((badvers.high(), badvers.low()), (ResponseCode::BADVERS.high(), ResponseCode::BADVERS.low()));
        let no_upstream = respond(
            &zone(),
            &Forwarding::default(),
            &query("example.com.", RecordType::A, None).to_vec().unwrap(),
            Transport::Udp,
            Recursion::Allowed,
        );
        assert_eq!(reply(no_upstream).0.response_code, ResponseCode::ServFail);
    }

    #[test]
    fn t10_clients_refused_recursion_get_cluster_names_only() {
        let ask = |msg: &Message, transport| {
            respond(&zone(), &forwarding(), &msg.to_vec().unwrap(), transport, Recursion::Refused)
        };
        let (r, _) = reply(ask(&query("www.example.com.", RecordType::A, Some(1232)), Transport::Udp));
        assert_eq!((r.response_code, r.recursion_available, r.answers.len()), (ResponseCode::Refused, false, 0));
        let (r, _) = reply(ask(&query("web.ns.svc.cluster.local.", RecordType::A, None), Transport::Udp));
        assert_eq!((r.response_code, r.recursion_available, r.answers.len()), (ResponseCode::NoError, false, 1));
        // An ExternalName's CNAME is the cluster's to say; its outside target is not chased.
        let (r, _) = reply(ask(&query("ext.ns.svc.cluster.local.", RecordType::A, None), Transport::Tcp));
        let shown: Vec<String> = r.answers.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["ext.ns.svc.cluster.local. 5 IN CNAME www.example.com."]);
        assert_eq!(r.response_code, ResponseCode::NoError);
        // 200 records: truncated over UDP to what the query's size allows, whole over TCP.
        let q = query("big.ns.svc.cluster.local.", RecordType::A, Some(4096));
        let sent = q.to_vec().unwrap().len();
        let (r, len) = reply(ask(&q, Transport::Udp));
        assert!(r.truncation && len <= sent * MAX_AMPLIFICATION, "{len} bytes for {sent}");
        let (r, _) = reply(ask(&q, Transport::Tcp));
        assert_eq!((r.truncation, r.answers.len()), (false, 200));
    }

    #[test]
    fn t10_malformed_packets_never_panic() {
        let zone = zone();
        let fwd = forwarding();
        assert!(matches!(respond(&zone, &fwd, &[], Transport::Udp, Recursion::Allowed), Outcome::Drop));
        assert!(matches!(respond(&zone, &fwd, &[0x12; 11], Transport::Udp, Recursion::Allowed), Outcome::Drop));
        let valid = query("web.ns.svc.cluster.local.", RecordType::A, Some(1232)).to_vec().unwrap();
        let (r, _) = reply(respond(&zone, &fwd, &valid[..valid.len() - 3], Transport::Udp, Recursion::Allowed));
        assert_eq!((r.id, r.response_code, r.queries.len()), (0x1234, ResponseCode::FormErr, 0));
        let mut response = valid.clone();
        response[2] |= 0x80;
        assert!(
            matches!(respond(&zone, &fwd, &response, Transport::Udp, Recursion::Allowed), Outcome::Drop),
            "responses are not answered"
        );
        // Mutations of a valid query: any outcome but a panic.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut packet = valid.clone();
            for _ in 0..=(next() % 4) {
                let i = (next() as usize) % packet.len();
                packet[i] = next() as u8;
            }
            packet.truncate(12 + (next() as usize) % (packet.len() - 11));
            for recursion in [Recursion::Allowed, Recursion::Refused] {
                let _ = respond(&zone, &fwd, &packet, Transport::Udp, recursion);
            }
        }
    }
}
