//! Multi-document YAML files into JSON values, each with the line where it starts.
//!
//! A file is split into documents at its `---` / `...` markers by a line scan (markers at column
//! 0 cannot be content in YAML), then each document is parsed once by serde_yaml into JSON. The
//! split gives each document's line, keeps YAML error positions per document, and lets a syntax
//! error in one document not hide the errors of the next ones.
//!
//! The text of a template's output is parsed the same way, with a map that turns its
//! lines into the template lines that wrote them: every line this module reports is a line of a
//! file in Git.

use crate::{Limits, ManifestError, ManifestFile, error::redacted, locate::LineIndex};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::{cell::Cell, fmt, ops::Range, sync::Arc};

/// For each line of a template's output (index 0: line 1), the template line that wrote it.
pub(crate) type LineMap = Arc<[u32]>;

/// The template line of rendered `line`, or `line` itself for a file that is not rendered.
pub(crate) fn map_line(map: Option<&LineMap>, line: usize) -> usize {
    match map {
        None => line,
        Some(map) => line
            .checked_sub(1)
            .and_then(|i| map.get(i).or(map.last()))
            .map_or(line, |&l| usize::try_from(l).unwrap_or(line)),
    }
}

/// One YAML document of a manifest file.
#[derive(Clone)]
pub struct Document {
    pub file: String,
    /// 0-based position of the document in its file, empty documents included.
    pub index: usize,
    /// 1-based line where the document's content starts.
    pub line: usize,
    pub value: Value,
    /// The document's YAML text, kept to find the line of an error.
    source: Option<Source>,
}

#[derive(Clone)]
struct Source {
    /// The whole file (or rendered output), shared by its documents.
    text: Arc<str>,
    range: Range<usize>,
    /// Line of the text where `range` starts.
    first_line: usize,
    /// Set when `text` is a template's output.
    map: Option<LineMap>,
    /// Where this document's value sits in the YAML document: `/items/3` for an item of a
    /// `kind: List`, empty otherwise.
    prefix: Arc<str>,
}

impl Document {
    /// A document that did not come from [`parse`]: its errors carry its own line only.
    pub fn new(file: impl Into<String>, index: usize, line: usize, value: Value) -> Self {
        Document { file: file.into(), index, line, value, source: None }
    }

    /// Where to find the lines of this document later, cheap to keep.
    pub(crate) fn locator(&self) -> Locator {
        Locator { source: self.source.clone(), line: self.line }
    }

    /// The lines of JSON pointers in this document, indexed now (error path only).
    pub(crate) fn lines(&self) -> DocumentLines {
        self.locator().lines()
    }
}

/// A document's text and line, kept to index it if an error needs a line.
#[derive(Clone)]
pub(crate) struct Locator {
    source: Option<Source>,
    line: usize,
}

impl Locator {
    pub(crate) fn lines(&self) -> DocumentLines {
        let index = self.source.as_ref().and_then(|s| {
            let text = s.text.get(s.range.clone())?;
            Some((LineIndex::new(text), s.first_line - 1, s.map.clone(), Arc::clone(&s.prefix)))
        });
        DocumentLines { index, fallback: self.line }
    }
}

impl fmt::Debug for Document {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Document")
            .field("file", &self.file)
            .field("index", &self.index)
            .field("line", &self.line)
            .field("value", &redacted(&self.value))
            .finish()
    }
}

/// Lines of JSON pointers in one document, in file lines (template lines for rendered text).
pub(crate) struct DocumentLines {
    index: Option<(LineIndex, usize, Option<LineMap>, Arc<str>)>,
    fallback: usize,
}

impl DocumentLines {
    pub(crate) fn line_of(&self, pointer: &str) -> usize {
        self.index
            .as_ref()
            .and_then(|(index, offset, map, prefix)| {
                index.line_of(&format!("{prefix}{pointer}")).map(|line| map_line(map.as_ref(), line + offset))
            })
            .unwrap_or(self.fallback)
    }
}

/// Parses every file into its non-empty documents. All errors of all files are returned.
pub fn parse(files: &[ManifestFile], limits: &Limits) -> Result<Vec<Document>, Vec<ManifestError>> {
    let (documents, errors) = parse_all(files, limits);
    if errors.is_empty() { Ok(documents) } else { Err(errors) }
}

/// Like [`parse`], keeping the documents that parsed when others did not, so that the caller can
/// report their validation errors too.
pub(crate) fn parse_all(files: &[ManifestFile], limits: &Limits) -> (Vec<Document>, Vec<ManifestError>) {
    let mut documents = Vec::new();
    let mut errors = Vec::new();
    for file in files {
        let text = match decode(&file.path, &file.content, limits) {
            Ok(text) => text,
            Err(error) => {
                errors.push(*error);
                continue;
            }
        };
        let left = limits.max_documents - documents.len().min(limits.max_documents);
        let parsed = parse_text(&file.path, text, None, limits, left);
        errors.extend(parsed.errors);
        if let Some((index, line)) = parsed.over {
            documents.extend(parsed.documents);
            errors.push(too_many_documents(&file.path, index, line, limits.max_documents));
            break;
        }
        documents.extend(parsed.documents);
    }
    (documents, errors)
}

/// The error for the first document over [`Limits::max_documents`].
pub(crate) fn too_many_documents(file: &str, index: usize, line: usize, limit: usize) -> ManifestError {
    let mut error = ManifestError::new(
        file,
        format!("more than {limit} YAML documents in the commit: split them across Applications"),
    );
    error.line = Some(line);
    error.document = Some(index);
    error
}

/// A manifest file's text: within the size limit, UTF-8, without a byte order mark. (The error is
/// boxed: it is the rare case, and large.)
pub(crate) fn decode(path: &str, content: &[u8], limits: &Limits) -> Result<Arc<str>, Box<ManifestError>> {
    if content.len() as u64 > limits.max_file_bytes {
        let (size, limit) = (crate::human_bytes(content.len() as u64), crate::human_bytes(limits.max_file_bytes));
        let message = format!("is {size}, over the limit of {limit} per manifest file: split it into smaller files");
        return Err(Box::new(ManifestError::new(path, message)));
    }
    match std::str::from_utf8(content) {
        Ok(text) => Ok(Arc::from(text.strip_prefix('\u{feff}').unwrap_or(text))),
        Err(e) => {
            let valid = &content[..e.valid_up_to()];
            let mut error = ManifestError::new(
                path,
                format!("not valid UTF-8 (at byte {}): save the file as UTF-8", e.valid_up_to()),
            );
            error.line = Some(1 + valid.iter().filter(|&&b| b == b'\n').count());
            Err(Box::new(error))
        }
    }
}

/// The documents and errors of one file's text.
pub(crate) struct Parsed {
    /// Its non-empty documents, at most `max_documents` of them.
    pub(crate) documents: Vec<Document>,
    pub(crate) errors: Vec<ManifestError>,
    /// (index, line) of the first document over `max_documents`, where parsing stopped.
    pub(crate) over: Option<(usize, usize)>,
}

/// Parses the text of one file (or of a template's output, with the `map` of its lines) into
/// its non-empty documents, stopping after `max_documents` of them.
pub(crate) fn parse_text(
    path: &str,
    text: Arc<str>,
    map: Option<&LineMap>,
    limits: &Limits,
    max_documents: usize,
) -> Parsed {
    let mut parsed = Parsed { documents: Vec::new(), errors: Vec::new(), over: None };
    // Aliases repeat their anchor's content: bound what a file may expand to by its size limit.
    let budget = Cell::new(usize::try_from(limits.max_file_bytes).unwrap_or(usize::MAX));
    let mut index = 0;
    for chunk in split_documents(&text) {
        let Some(chunk_text) = text.get(chunk.range.clone()) else { continue };
        for yaml in serde_yaml::Deserializer::from_str(chunk_text) {
            let value = match (StrictValue { budget: &budget }).deserialize(yaml) {
                Ok(value) => value,
                Err(e) => {
                    parsed.errors.push(yaml_error(path, index, chunk_text, chunk.first_line, map, &e));
                    index += 1;
                    // serde_yaml stops at a syntax error; the next chunk starts afresh.
                    break;
                }
            };
            let source = Source {
                text: Arc::clone(&text),
                range: chunk.range.clone(),
                first_line: chunk.first_line,
                map: map.cloned(),
                prefix: Arc::from(""),
            };
            let line = map_line(map, chunk.line);
            let document = Document { file: path.to_owned(), index, line, value, source: Some(source) };
            index += 1;
            if document.value.is_null() {
                continue;
            }
            let documents = match list_items(document) {
                Ok(documents) => documents,
                Err(error) => {
                    parsed.errors.push(*error);
                    continue;
                }
            };
            for document in documents {
                if parsed.documents.len() >= max_documents {
                    parsed.over = Some((document.index, document.line));
                    return parsed;
                }
                parsed.documents.push(document);
            }
        }
    }
    parsed
}

/// A document, or the items of a `kind: List` (how `kubectl get -o yaml` writes many objects,
/// and which `kubectl apply` takes): each item is then a document of its own, whose lines are
/// found under `/items/N`.
fn list_items(document: Document) -> Result<Vec<Document>, Box<ManifestError>> {
    if document.value.get("kind").and_then(Value::as_str) != Some("List") {
        return Ok(vec![document]);
    }
    let Some(items) = document.value.get("items").and_then(Value::as_array) else {
        let mut error = ManifestError::new(
            &document.file,
            "a kind List holds its objects in `items`, a list: add them there, or write each object as its own \
             YAML document, separated by ---",
        );
        error.line = Some(document.lines().line_of("/kind"));
        error.document = Some(document.index);
        error.path = Some("/items".into());
        return Err(Box::new(error));
    };
    let lines = document.lines();
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let prefix = format!("/items/{i}");
            let line = lines.line_of(&prefix);
            let source = document.source.clone().map(|s| Source { prefix: Arc::from(prefix), ..s });
            Document { file: document.file.clone(), index: document.index, line, value: item.clone(), source }
        })
        .collect())
}

/// A YAML error at its file position, the positions in the parser's message moved from the
/// document's lines to the file's (to the template's, for rendered text: without columns, which
/// are the output's).
fn yaml_error(
    file: &str,
    index: usize,
    text: &str,
    first_line: usize,
    map: Option<&LineMap>,
    e: &serde_yaml::Error,
) -> ManifestError {
    let mut error = ManifestError::new(file, e.to_string());
    error.document = Some(index);
    if let Some(location) = e.location() {
        let own = (location.line(), location.column());
        let at = |line: usize, column: usize| match map {
            None => format!("line {} column {column}", line + first_line - 1),
            Some(map) => format!("template line {}", map_line(Some(map), line + first_line - 1)),
        };
        error.message = shift_lines(&error.message, own, at);
        // serde_yaml places a duplicate key at its mapping: point at the key itself.
        let (line, column) = match StrictValue::is_duplicate_key(&error.message) {
            true => LineIndex::new(text).first_duplicate().unwrap_or(own),
            false => own,
        };
        error.line = Some(map_line(map, line + first_line - 1));
        error.column = map.is_none().then_some(column);
    }
    // `{{ x }}` is a YAML flow mapping inside a flow mapping: the parser's message says "map"
    // where the author wrote a placeholder of some template tool.
    if map.is_none() && text.contains("{{") {
        error.message.push_str(
            ": this document holds `{{ }}` placeholders; name the file *.yaml.j2 to render it as a \
             minijinja template, or put values in their place",
        );
    }
    error
}

/// Drops the ` at line L column C` of the error's own position (shown before the message) and
/// rewrites the other positions the message names with `at(L, C)`.
fn shift_lines(message: &str, own: (usize, usize), at: impl Fn(usize, usize) -> String) -> String {
    const AT: &str = " at line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(AT) {
        let after = &rest[start + AT.len()..];
        let Some((line, column, len)) = line_column(after) else {
            out.push_str(&rest[..start + AT.len()]);
            rest = after;
            continue;
        };
        out.push_str(&rest[..start]);
        if (line, column) != own {
            out.push_str(" at ");
            out.push_str(&at(line, column));
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Parses `L column C` at the start of `s`: (L, C, length).
fn line_column(s: &str) -> Option<(usize, usize, usize)> {
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let line_len = digits(s);
    let line = s[..line_len].parse().ok()?;
    let after_line = s[line_len..].strip_prefix(" column ")?;
    let column_len = digits(after_line);
    let column = after_line[..column_len].parse().ok()?;
    Some((line, column, line_len + " column ".len() + column_len))
}

/// An object as YAML, with `apiVersion`, `kind` and `metadata` first, as people write
/// manifests (the rest sorted): what `gitplane render` prints.
pub fn to_yaml(value: &Value) -> Result<String, serde_yaml::Error> {
    let Some(object) = value.as_object() else { return serde_yaml::to_string(value) };
    let mut ordered = serde_yaml::Mapping::new();
    let first = ["apiVersion", "kind", "metadata"];
    for key in first.iter().copied().chain(object.keys().map(String::as_str).filter(|k| !first.contains(k))) {
        if let Some(v) = object.get(key) {
            ordered.insert(key.into(), serde_yaml::to_value(v)?);
        }
    }
    serde_yaml::to_string(&ordered)
}

/// One document's text as found by [`split_documents`].
#[derive(Debug, PartialEq, Eq)]
struct Chunk {
    range: Range<usize>,
    /// Line where the chunk's text starts.
    first_line: usize,
    /// Line where its content starts (the marker's line for an empty document).
    line: usize,
}

/// Splits YAML text into documents at `---` and `...` lines. Comments, blank lines and
/// directives before a `---` stay with the document that follows.
fn split_documents(text: &str) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut content_line: Option<usize> = None;
    let mut marker_line: Option<usize> = None;
    let mut offset = 0;
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let number = i + 1;
        let line = raw.trim_end_matches(['\n', '\r']);
        if let Some(rest) = marker(line, "---") {
            if content_line.is_some() || marker_line.is_some() {
                let line = content_line.or(marker_line).unwrap_or(first_line);
                chunks.push(Chunk { range: start..offset, first_line, line });
                start = offset;
                first_line = number;
                content_line = None;
            }
            marker_line = Some(number);
            if is_content(rest) {
                content_line = Some(number);
            }
        } else if marker(line, "...").is_some() {
            let end = offset + raw.len();
            let line = content_line.or(marker_line).unwrap_or(number);
            chunks.push(Chunk { range: start..end, first_line, line });
            start = end;
            first_line = number + 1;
            content_line = None;
            marker_line = None;
        } else if content_line.is_none() && is_content(line) && !line.starts_with('%') {
            content_line = Some(number);
        }
        offset += raw.len();
    }
    if start < text.len() || chunks.is_empty() {
        let line = content_line.or(marker_line).unwrap_or(first_line);
        chunks.push(Chunk { range: start..text.len(), first_line, line });
    }
    chunks
}

/// The rest of the line after a document marker at column 0, if it is one.
fn marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(marker)?;
    (rest.is_empty() || rest.starts_with([' ', '\t'])).then_some(rest)
}

fn is_content(line: &str) -> bool {
    let line = line.trim_start();
    !line.is_empty() && !line.starts_with('#')
}

/// Deserializes YAML into JSON, stricter than `serde_json::Value`: duplicate keys, non-string
/// keys, tags and non-finite numbers are errors, and the values built count against a budget.
struct StrictValue<'b> {
    budget: &'b Cell<usize>,
}

impl StrictValue<'_> {
    const DUPLICATE_KEY: &'static str = "duplicate key ";

    fn is_duplicate_key(message: &str) -> bool {
        message.contains(Self::DUPLICATE_KEY)
    }

    fn spend<E: de::Error>(&self) -> Result<(), E> {
        match self.budget.get().checked_sub(1) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(E::custom(
                "the file expands to too many values (YAML aliases repeat what their anchor holds): \
                 write the values out, or split the file",
            )),
        }
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value Kubernetes objects can hold (no YAML tags)")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.spend()?;
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(".inf and .nan are not valid values: write a number, or quote it"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.spend()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.spend()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictValue { budget: self.budget })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.spend()?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(StringKey)? {
            // One lookup per key: this is the hot path of a cold load.
            match object.entry(key) {
                serde_json::map::Entry::Occupied(entry) => {
                    let key = entry.key();
                    return Err(de::Error::custom(format!("{}{key:?}: keep one of them", Self::DUPLICATE_KEY)));
                }
                serde_json::map::Entry::Vacant(entry) => {
                    entry.insert(map.next_value_seed(StrictValue { budget: self.budget })?);
                }
            }
        }
        Ok(Value::Object(object))
    }
}

/// A mapping key: JSON, and so Kubernetes, has string keys only.
struct StringKey;

impl StringKey {
    fn not_a_string<E: de::Error>(key: impl fmt::Display) -> E {
        E::custom(format!("the key {key} is not a string: quote it"))
    }
}

impl<'de> DeserializeSeed<'de> for StringKey {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringKey {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Err(Self::not_a_string(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Err(Self::not_a_string(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Err(Self::not_a_string(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Err(Self::not_a_string(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(Self::not_a_string("null"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(path: &str, content: &str) -> ManifestFile {
        ManifestFile::new(path, content.as_bytes().to_vec())
    }

    fn errors(files: &[ManifestFile]) -> Vec<String> {
        match parse(files, &Limits::default()) {
            Ok(docs) => panic!("parsed: {docs:?}"),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn t10_yaml_puts_the_type_first() {
        let value =
            json!({"data": {"b": "2", "a": "1"}, "metadata": {"name": "c"}, "kind": "ConfigMap", "apiVersion": "v1"});
        assert_eq!(
            to_yaml(&value).unwrap(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n  b: '2'\n"
        );
        assert_eq!(to_yaml(&json!([1])).unwrap(), "- 1\n");
    }

    #[test]
    fn t10_split_documents() {
        let chunk = |range: Range<usize>, first_line, line| Chunk { range, first_line, line };
        let cases: &[(&str, Vec<Chunk>)] = &[
            ("", vec![chunk(0..0, 1, 1)]),
            ("a: 1\n", vec![chunk(0..5, 1, 1)]),
            ("# c\n---\na: 1\n", vec![chunk(0..13, 1, 3)]),
            ("a: 1\n---\nb: 2\n", vec![chunk(0..5, 1, 1), chunk(5..14, 2, 3)]),
            ("---\n---\nb: 2", vec![chunk(0..4, 1, 1), chunk(4..12, 2, 3)]),
            ("--- {a: 1}\n--- |\n  x\n", vec![chunk(0..11, 1, 1), chunk(11..21, 2, 2)]),
            ("a: 1\n...\n# end\n", vec![chunk(0..9, 1, 1), chunk(9..15, 3, 3)]),
            ("%YAML 1.2\n---\na: 1\r\n----\r\n", vec![chunk(0..26, 1, 3)]),
        ];
        for (text, chunks) in cases {
            assert_eq!(&split_documents(text), chunks, "{text:?}");
        }
    }

    #[test]
    fn t10_multi_document_files() {
        let text = "\
# leading comment
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
---
# only a comment
---

---
apiVersion: v1   # trailing comment
kind: ConfigMap
metadata:
  name: b
...
---
null
";
        let docs = parse(&[file("cm.yaml", text), file("empty.yaml", "")], &Limits::default()).unwrap();
        let seen: Vec<_> =
            docs.iter().map(|d| (d.file.as_str(), d.index, d.line, d.value["metadata"]["name"].clone())).collect();
        assert_eq!(seen, [("cm.yaml", 0, 3, json!("a")), ("cm.yaml", 3, 11, json!("b"))]);
    }

    #[test]
    fn t10_a_list_is_its_items() {
        let text = "\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: a}
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: b
";
        let docs = parse(&[file("list.yaml", text)], &Limits::default()).unwrap();
        let seen: Vec<_> = docs
            .iter()
            .map(|d| (d.index, d.line, d.value["metadata"]["name"].clone(), d.lines().line_of("/metadata/name")))
            .collect();
        assert_eq!(seen, [(0, 4, json!("a"), 6), (0, 7, json!("b"), 10)]);
    }

    #[test]
    fn t10_yaml_errors_name_file_line_and_column() {
        let text = "a: 1\n---\nmetadata:\n  name: x\n labels: {}\n---\nb: [1, 2\n---\nc: 3\nc: 4\n";
        assert_eq!(
            errors(&[file("bad.yaml", text)]),
            [
                "bad.yaml:5:2 (document 2): did not find expected key, while parsing a block mapping at line 3 column 1",
                "bad.yaml:8:1 (document 3): did not find expected ',' or ']', while parsing a flow sequence at line 7 column 4",
                "bad.yaml:10:1 (document 4): duplicate key \"c\": keep one of them",
            ]
        );
    }

    #[test]
    fn t10_an_unrendered_template_is_named_so() {
        let text = "kind: Deployment\nspec:\n  replicas: {{replicas}}\n";
        let errors = errors(&[file("vitess.yaml", text)]);
        assert!(errors.len() == 1 && errors[0].starts_with("vitess.yaml:3:"), "{errors:?}");
        assert!(
            errors[0].ends_with(
                "name the file *.yaml.j2 to render it as a minijinja template, or put values in their place"
            )
        );
    }

    #[test]
    fn t10_values_json_cannot_hold_are_errors() {
        let cases = [
            ("80: http\n", "k.yaml:1:1: the key 80 is not a string: quote it"),
            (
                "metadata:\n  labels:\n    true: x\n",
                "k.yaml:3:5: metadata.labels: the key true is not a string: quote it",
            ),
            (
                "a: !custom x\n",
                "k.yaml:1:4: a: invalid type: enum, expected a value Kubernetes objects can hold (no YAML tags)",
            ),
            ("a: .nan\n", "k.yaml:1:4: a: .inf and .nan are not valid values: write a number, or quote it"),
            ("a: *nowhere\n", "k.yaml:1:4: unknown anchor"),
        ];
        for (text, expected) in cases {
            assert_eq!(errors(&[file("k.yaml", text)]), [expected], "{text:?}");
        }
    }

    #[test]
    fn t10_invalid_utf8_and_lists_and_all_files() {
        let files = [
            ManifestFile::new("a.yaml", b"a: 1\nb: \xff\n".to_vec()),
            file("list.yaml", "apiVersion: v1\nkind: List\nitems: {}\n"),
            file("ok.yaml", "a: 1\n"),
            file("z.yaml", "x: [\n"),
        ];
        assert_eq!(
            errors(&files),
            [
                "a.yaml:2: not valid UTF-8 (at byte 8): save the file as UTF-8",
                "list.yaml:2: /items: a kind List holds its objects in `items`, a list: add them there, or write each object as its own YAML document, separated by ---",
                "z.yaml:2:1: did not find expected node content, while parsing a flow node",
            ]
        );
    }

    #[test]
    fn t10_hostile_nesting_is_an_error() {
        let deep = format!("a: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
        let errors = errors(&[file("deep.yaml", &deep)]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("deep.yaml:1:") && errors[0].ends_with("recursion limit exceeded"), "{errors:?}");
    }

    #[test]
    fn t10_limits() {
        let limits = Limits { max_file_bytes: 64, max_documents: 2, ..Limits::default() };
        let too_many = [file("a.yaml", "a: 1\n---\nb: 2\n"), file("b.yaml", "c: 3\n")];
        let errors: Vec<_> = parse(&too_many, &limits).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(errors, ["b.yaml:1: more than 2 YAML documents in the commit: split them across Applications"]);

        // Aliases cannot expand a small file into a large value.
        let bomb = "a: &a [1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n";
        let small = Limits { max_file_bytes: 150, ..limits.clone() };
        assert!(parse(&[file("ok.yaml", "a: &a [1, 2]\nb: *a\n")], &small).is_ok());
        let errors: Vec<_> =
            parse(&[file("bomb.yaml", bomb)], &small).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("bomb.yaml:1:11: c[0][7][1]: the file expands to too many values"), "{errors:?}");

        let big = file("big.yaml", &"a: 1\n".repeat(20));
        let errors: Vec<_> = parse(&[big], &limits).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            ["big.yaml: is 100 bytes, over the limit of 64 bytes per manifest file: split it into smaller files"]
        );
    }
}
