//! The CRI log format, pure: one record per line,
//! `<RFC3339Nano time> <stdout|stderr> <tags> <content>`, where the first tag is `F` (the record
//! ends a line) or `P` (a partial line: containerd splits lines longer than its buffer, and the
//! next records of the same stream continue it).
//!
//! What `kubectl logs` prints from it ([`LogWriter`]): each line once, partial records joined
//! (the kubelet prints them separately; joining keeps a long line whole and its timestamp the
//! first record's), lines older than `sinceTime` left out, the record's own timestamp in front
//! with `timestamps`, and no more than `limitBytes` bytes. [`tail_start`] finds where the last
//! `tailLines` lines begin by reading the file backwards.

use k8s_openapi::jiff::Timestamp;
use std::io::{Read, Seek, SeekFrom};

/// Which output stream a record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One record of a CRI log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The time as written (RFC 3339 with nanoseconds), printed as is with `timestamps`.
    pub time: &'a str,
    pub timestamp: Timestamp,
    pub stream: Stream,
    /// A `P` record: the line continues in the next record of the stream.
    pub partial: bool,
    pub content: &'a [u8],
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("a CRI log record needs `<time> <stream> <tag> <content>`")]
    Fields,
    #[error("{0:?} is not an RFC 3339 time")]
    Time(String),
    #[error("{0:?} is neither stdout nor stderr")]
    Stream(String),
    #[error("{0:?} is neither F nor P")]
    Tag(String),
}

/// Parses one record (without its newline).
pub fn parse(line: &[u8]) -> Result<Record<'_>, ParseError> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let (Some(time), Some(stream), Some(tags)) = (fields.next(), fields.next(), fields.next()) else {
        return Err(ParseError::Fields);
    };
    let content = fields.next().unwrap_or_default();
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let time = std::str::from_utf8(time).map_err(|_| ParseError::Time(lossy(time)))?;
    let timestamp = time.parse::<Timestamp>().map_err(|_| ParseError::Time(time.to_owned()))?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        other => return Err(ParseError::Stream(lossy(other))),
    };
    let partial = match tags.split(|b| *b == b':').next() {
        Some(b"F") => false,
        Some(b"P") => true,
        _ => return Err(ParseError::Tag(lossy(tags))),
    };
    Ok(Record { time, timestamp, stream, partial, content })
}

/// Whether a record's tag is `P`, from its first bytes only (for the backward scan).
fn is_partial(head: &[u8]) -> bool {
    head.split(|b| *b == b' ').nth(2).is_some_and(|tags| tags.split(|b| *b == b':').next() == Some(b"P"))
}

/// What a `kubectl logs` request asks of the lines it reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Lines older than this are left out.
    pub since: Option<Timestamp>,
    /// Each line starts with its RFC 3339 time and a space.
    pub timestamps: bool,
    /// The last this many lines only.
    pub tail: Option<u64>,
    /// At most this many bytes in all; the last line may be cut.
    pub limit_bytes: Option<u64>,
    /// Keep reading as the container writes, until it stops.
    pub follow: bool,
}

/// The longest joined line kept in memory: a container that never ends its line has it printed
/// in pieces of this size rather than held.
const MAX_JOINED: usize = 1 << 20;

/// Whether a reader may go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// `limitBytes` is reached.
    Done,
}

/// A line being joined from partial records of one stream: its first record's time, the text.
#[derive(Debug, Default)]
struct Pending {
    time: String,
    timestamp: Option<Timestamp>,
    text: Vec<u8>,
}

/// Turns records into the bytes `kubectl logs` prints (see the module docs).
#[derive(Debug)]
pub struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    left: Option<u64>,
    pending: [Pending; 2],
    /// Records that were not CRI records (skipped).
    pub malformed: u64,
}

impl LogWriter {
    pub fn new(options: &LogOptions) -> LogWriter {
        LogWriter {
            since: options.since,
            timestamps: options.timestamps,
            left: options.limit_bytes,
            pending: Default::default(),
            malformed: 0,
        }
    }

    /// Takes one record (without its newline), appending what it completes to `out`.
    pub fn record(&mut self, line: &[u8], out: &mut Vec<u8>) -> Flow {
        if self.left == Some(0) {
            return Flow::Done;
        }
        let record = match parse(line) {
            Ok(record) => record,
            Err(_) => {
                self.malformed += 1;
                return Flow::Continue;
            }
        };
        let pending = &mut self.pending[record.stream as usize];
        if pending.timestamp.is_none() {
            pending.time = record.time.to_owned();
            pending.timestamp = Some(record.timestamp);
        }
        pending.text.extend_from_slice(record.content);
        if record.partial && pending.text.len() < MAX_JOINED {
            return Flow::Continue;
        }
        let line = std::mem::take(pending);
        self.emit(line, !record.partial, out)
    }

    /// Prints what partial records are still held (the end of what there is to read).
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Flow {
        for stream in 0..2 {
            let line = std::mem::take(&mut self.pending[stream]);
            if line.timestamp.is_some() && self.emit(line, false, out) == Flow::Done {
                return Flow::Done;
            }
        }
        if self.left == Some(0) { Flow::Done } else { Flow::Continue }
    }

    fn emit(&mut self, line: Pending, newline: bool, out: &mut Vec<u8>) -> Flow {
        if let (Some(since), Some(at)) = (self.since, line.timestamp)
            && at < since
        {
            return Flow::Continue;
        }
        let start = out.len();
        if self.timestamps {
            out.extend_from_slice(line.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&line.text);
        if newline {
            out.push(b'\n');
        }
        let Some(left) = self.left.as_mut() else { return Flow::Continue };
        let written = (out.len() - start) as u64;
        if written >= *left {
            out.truncate(start + usize::try_from(*left).unwrap_or(usize::MAX));
            *left = 0;
            return Flow::Done;
        }
        *left -= written;
        Flow::Continue
    }
}

/// How much of a file is read at a time, backwards, to find the tail.
const TAIL_CHUNK: u64 = 64 << 10;
/// Enough of a record's start to read its tag.
const HEAD: usize = 128;

/// Where the last `lines` lines of a CRI log of `len` bytes begin, and how many lines were
/// found (fewer than asked when the file starts first: then the offset is 0). A line is a run
/// of records ending with an `F` one; a run of `P` records at the end (a line being written)
/// counts as a line.
pub fn tail_start<R: Read + Seek>(file: &mut R, len: u64, lines: u64) -> std::io::Result<(u64, u64)> {
    if lines == 0 {
        return Ok((len, 0));
    }
    let mut found = 0;
    let mut pos = len;
    // The end of the record whose start is being looked for, and the first bytes after `pos`.
    let mut record_end = len;
    let mut after: Vec<u8> = Vec::new();
    let mut chunk = Vec::new();
    while pos > 0 {
        let start = pos.saturating_sub(TAIL_CHUNK);
        chunk.resize(usize::try_from(pos - start).unwrap_or(0), 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        for i in (0..chunk.len()).rev() {
            if chunk[i] != b'\n' {
                continue;
            }
            let newline = start + i as u64;
            // The record [newline + 1, record_end) is now whole: a line starts after it when it
            // is an F record with something after it.
            if newline + 1 < record_end {
                let mut head = chunk[i + 1..].iter().take(HEAD).copied().collect::<Vec<u8>>();
                head.extend(after.iter().take(HEAD - head.len()));
                if !is_partial(&head) && record_end < len {
                    found += 1;
                    if found == lines {
                        return Ok((record_end, found));
                    }
                }
            }
            record_end = newline + 1;
        }
        let mut next = chunk.iter().take(HEAD).copied().collect::<Vec<u8>>();
        next.extend(after.iter().take(HEAD - next.len()));
        after = next;
        pos = start;
    }
    // The file's first record, then the line that starts the file.
    if record_end > 0 && !is_partial(&after) && record_end < len {
        found += 1;
        if found == lines {
            return Ok((record_end, found));
        }
    }
    if len > 0 {
        found += 1;
    }
    Ok((0, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const T1: &str = "2026-12-03T16:15:34.123456789Z";
    const T2: &str = "2026-12-03T16:15:35.5Z";
    const T3: &str = "2026-12-03T16:15:36Z";

    fn write(options: &LogOptions, lines: &[&str]) -> String {
        let mut writer = LogWriter::new(options);
        let mut out = Vec::new();
        for line in lines {
            if writer.record(line.as_bytes(), &mut out) == Flow::Done {
                break;
            }
        }
        writer.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn parses_records() {
        let line = format!("{T1} stderr F hello world");
        let record = parse(line.as_bytes()).unwrap();
        assert_eq!(record.time, T1);
        assert_eq!((record.stream, record.partial, record.content), (Stream::Stderr, false, &b"hello world"[..]));
        assert_eq!(record.timestamp, T1.parse::<Timestamp>().unwrap());
        // Empty content, extra tags, an offset instead of Z.
        assert_eq!(parse(format!("{T2} stdout P:x ").as_bytes()).unwrap().content, b"");
        assert!(parse(format!("{T2} stdout P:x ").as_bytes()).unwrap().partial);
        assert!(parse(b"2026-12-03T17:15:36+01:00 stdout F a").is_ok());
        assert_eq!(parse(b"garbage"), Err(ParseError::Fields));
        assert_eq!(parse(b"yesterday stdout F a"), Err(ParseError::Time("yesterday".into())));
        assert_eq!(parse(format!("{T1} stdin F a").as_bytes()), Err(ParseError::Stream("stdin".into())));
        assert_eq!(parse(format!("{T1} stdout X a").as_bytes()), Err(ParseError::Tag("X".into())));
        assert!(parse(b"\xff\xfe stdout F a").is_err());
    }

    #[test]
    fn joins_partial_records_per_stream() {
        let lines = [
            &format!("{T1} stdout P hel") as &str,
            &format!("{T1} stderr F oops"),
            &format!("{T2} stdout P lo "),
            &format!("{T2} stdout F world"),
            &format!("{T3} stdout F !"),
        ];
        let plain = write(&LogOptions::default(), &lines);
        assert_eq!(plain, "oops\nhello world\n!\n");
        let stamped = write(&LogOptions { timestamps: true, ..Default::default() }, &lines);
        assert_eq!(stamped, format!("{T1} oops\n{T1} hello world\n{T3} !\n"));
        // A line still being written is printed as far as it goes, without a newline.
        assert_eq!(write(&LogOptions::default(), &lines[..3]), "oops\nhello ");
        // Malformed records are skipped, not fatal.
        assert_eq!(write(&LogOptions::default(), &["nonsense", &format!("{T3} stdout F ok")]), "ok\n");
    }

    #[test]
    fn since_and_limit_bytes() {
        let lines = [format!("{T1} stdout F one"), format!("{T2} stdout F two"), format!("{T3} stdout F three")];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let since = |t: &str| LogOptions { since: Some(t.parse().unwrap()), ..Default::default() };
        assert_eq!(write(&since(T2), &lines), "two\nthree\n");
        assert_eq!(write(&since("2026-12-03T16:15:35Z"), &lines), "two\nthree\n");
        assert_eq!(write(&since("2027-01-01T00:00:00Z"), &lines), "");
        let limit = |n| LogOptions { limit_bytes: Some(n), ..Default::default() };
        assert_eq!(write(&limit(6), &lines), "one\ntw");
        assert_eq!(write(&limit(4), &lines), "one\n");
        assert_eq!(write(&limit(1000), &lines), "one\ntwo\nthree\n");
        let mut writer = LogWriter::new(&limit(4));
        let mut out = Vec::new();
        assert_eq!(writer.record(lines[0].as_bytes(), &mut out), Flow::Done);
        assert_eq!(writer.record(lines[1].as_bytes(), &mut out), Flow::Done);
        assert_eq!(out, b"one\n");
    }

    fn tail(text: &str, lines: u64) -> (String, u64) {
        let (start, found) = tail_start(&mut Cursor::new(text.as_bytes()), text.len() as u64, lines).unwrap();
        (text[start as usize..].to_owned(), found)
    }

    #[test]
    fn tail_counts_joined_lines_from_the_end() {
        let a = format!("{T1} stdout F a\n");
        let b1 = format!("{T1} stdout P b1\n");
        let b2 = format!("{T2} stdout F b2\n");
        let c = format!("{T3} stderr F c\n");
        let text = format!("{a}{b1}{b2}{c}");
        assert_eq!(tail(&text, 0), (String::new(), 0));
        assert_eq!(tail(&text, 1), (c.clone(), 1));
        assert_eq!(tail(&text, 2), (format!("{b1}{b2}{c}"), 2));
        assert_eq!(tail(&text, 3), (text.clone(), 3));
        assert_eq!(tail(&text, 10), (text.clone(), 3));
        // A line being written (P at the end, no newline yet) counts.
        let writing = format!("{a}{b1}{}", b2.trim_end().replace(" F ", " P "));
        assert_eq!(tail(&writing, 1), (format!("{b1}{}", b2.trim_end().replace(" F ", " P ")), 1));
        assert_eq!(tail("", 3), (String::new(), 0));
    }

    #[test]
    fn tail_reads_across_chunks() {
        // Lines longer than a chunk, and many of them.
        let long = "x".repeat(TAIL_CHUNK as usize + 17);
        let mut text = String::new();
        for i in 0..5 {
            text.push_str(&format!("{T1} stdout F {i}{long}\n"));
        }
        for i in 0..3000 {
            text.push_str(&format!("{T2} stdout F line {i}\n"));
        }
        let (last, found) = tail(&text, 2);
        assert_eq!((last.as_str(), found), (format!("{T2} stdout F line 2998\n{T2} stdout F line 2999\n").as_str(), 2));
        let (last, found) = tail(&text, 3002);
        assert_eq!(found, 3002);
        assert!(last.starts_with(&format!("{T1} stdout F 3x")), "{}", &last[..60]);
        assert_eq!(tail(&text, 5000), (text.clone(), 3005));
        // Through the writer: the last lines, whole.
        let mut writer = LogWriter::new(&LogOptions::default());
        let mut out = Vec::new();
        for record in tail(&text, 3).0.lines() {
            writer.record(record.as_bytes(), &mut out);
        }
        assert_eq!(String::from_utf8(out).unwrap(), "line 2997\nline 2998\nline 2999\n");
    }
}
