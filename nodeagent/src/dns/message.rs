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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
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
        let mut response = response_to(&self.request);
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
        let mut response = response_to(&self.request);
        response.metadata.response_code = code;
        encode(&response, self.max_size)
    }
}

/// Decides the answer to one packet from the zone and the forwarding table.
pub fn respond(zone: &Zone, forwarding: &Forwarding, packet: &[u8], transport: Transport) -> Outcome {
    let Ok(header) = Header::read(&mut BinDecoder::new(packet)) else { return Outcome::Drop };
    if header.message_type != MessageType::Query {
        return Outcome::Drop;
    }
    let request = match Message::from_vec(packet) {
        Ok(request) => request,
        Err(_) => return Outcome::Reply(header_only(&header.metadata, ResponseCode::FormErr)),
    };
    let max_size = match transport {
        Transport::Tcp => u16::MAX,
        Transport::Udp => request.max_payload().min(MAX_UDP_PAYLOAD),
    };
    let error = |code| {
        let mut response = response_to(&request);
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
        let mut response = response_to(&request);
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

/// A response to `request` without records: its id, question, RD and CD bits, and an OPT
/// record when the client sent one.
fn response_to(request: &Message) -> Message {
    let mut response = Message::new(request.id, MessageType::Response, request.op_code);
    response.metadata = Metadata::response_from_request(&request.metadata);
    response.metadata.recursion_available = true;
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
