//! Lines of JSON pointers in YAML text, for error messages.
//!
//! serde_yaml gives values without positions, so the happy path stays one parse per document.
//! Only when a document has errors is its text scanned again, with an event parser that reports
//! positions, into a tree of lines that answers each error's pointer.

use saphyr_parser::{Event, Parser};
use std::collections::HashSet;

/// The lines of the nodes of one YAML document.
pub(crate) struct LineIndex {
    root: Option<Node>,
    /// (line, 1-based column) of the first key repeated in its mapping, in document order: the
    /// one serde_yaml reports, at the line of the mapping only.
    first_duplicate: Option<(usize, usize)>,
}

struct Node {
    /// 1-based line where the node starts.
    line: usize,
    children: Children,
}

enum Children {
    Leaf,
    /// Entries with a string key: (key, line of the key, value).
    Map(Vec<(String, usize, Node)>),
    Seq(Vec<Node>),
}

/// A collection being built; `key` is the key read for the entry whose value comes next, with
/// its line and column.
enum Frame {
    Map {
        line: usize,
        entries: Vec<(String, usize, Node)>,
        keys: HashSet<String>,
        key: Option<(Option<String>, usize, usize)>,
    },
    Seq {
        line: usize,
        items: Vec<Node>,
    },
}

impl LineIndex {
    /// Indexes the first document of `text`. Text the event parser rejects gives an empty
    /// index: callers then fall back to the line of the document.
    pub(crate) fn new(text: &str) -> Self {
        let mut first_duplicate = None;
        let root = build(text, &mut first_duplicate);
        LineIndex { root, first_duplicate }
    }

    pub(crate) fn first_duplicate(&self) -> Option<(usize, usize)> {
        self.first_duplicate
    }

    /// The line of the value at `pointer` (of a map entry: the line of its key). A pointer to a
    /// missing node gives the line of its nearest existing parent.
    pub(crate) fn line_of(&self, pointer: &str) -> Option<usize> {
        let mut node = self.root.as_ref()?;
        let mut line = node.line;
        for segment in segments(pointer) {
            let next = match &node.children {
                Children::Map(entries) => {
                    entries.iter().find(|(key, _, _)| *key == segment).map(|(_, key_line, value)| (*key_line, value))
                }
                Children::Seq(items) => {
                    segment.parse::<usize>().ok().and_then(|i| items.get(i)).map(|item| (item.line, item))
                }
                Children::Leaf => None,
            };
            match next {
                Some((next_line, next_node)) => {
                    line = next_line;
                    node = next_node;
                }
                None => break,
            }
        }
        Some(line)
    }
}

/// The unescaped segments of a JSON pointer (RFC 6901).
pub(crate) fn segments(pointer: &str) -> impl Iterator<Item = String> + '_ {
    pointer.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~"))
}

/// Escapes one segment of a JSON pointer.
pub(crate) fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Builds the tree with an explicit stack: the text is hostile input, recursion is not.
fn build(text: &str, first_duplicate: &mut Option<(usize, usize)>) -> Option<Node> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    loop {
        let (event, span) = parser.next_event()?.ok()?;
        let (line, column) = (span.start.line(), span.start.col() + 1);
        let done = match event {
            Event::StreamStart | Event::DocumentStart(_) | Event::Nothing => continue,
            Event::StreamEnd | Event::DocumentEnd => return None,
            Event::MappingStart(..) => {
                stack.push(Frame::Map { line, entries: Vec::new(), keys: HashSet::new(), key: None });
                continue;
            }
            Event::SequenceStart(..) => {
                stack.push(Frame::Seq { line, items: Vec::new() });
                continue;
            }
            Event::Scalar(value, ..) => (Node { line, children: Children::Leaf }, Some(value.into_owned())),
            Event::Alias(_) => (Node { line, children: Children::Leaf }, None),
            Event::MappingEnd | Event::SequenceEnd => match stack.pop()? {
                Frame::Map { line, entries, .. } => (Node { line, children: Children::Map(entries) }, None),
                Frame::Seq { line, items } => (Node { line, children: Children::Seq(items) }, None),
            },
        };
        let (node, scalar) = done;
        match stack.last_mut() {
            None => return Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, keys, key, .. }) => match key.take() {
                // A key that is not a scalar (or an alias) cannot be in a JSON pointer.
                None => *key = Some((scalar, node.line, column)),
                Some((Some(name), key_line, key_column)) => {
                    if !keys.insert(name.clone()) {
                        first_duplicate.get_or_insert((key_line, key_column));
                    }
                    entries.push((name, key_line, node));
                }
                Some((None, ..)) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
# a comment
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, \"a/b\": x}
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: web
          image: httpd
        -
          name: sidecar
      more: &anchor
        - x
      alias: *anchor
";

    #[test]
    fn t10_lines_of_pointers() {
        let index = LineIndex::new(DOC);
        let cases = [
            ("", 2),
            ("/kind", 3),
            ("/metadata", 4),
            ("/metadata/name", 5),
            ("/metadata/labels/app", 6),
            ("/metadata/labels/a~1b", 6),
            ("/spec/replicas", 8),
            ("/spec/template", 9),
            ("/spec/template/spec/containers/0", 12),
            ("/spec/template/spec/containers/0/image", 13),
            ("/spec/template/spec/containers/1", 15),
            ("/spec/template/spec/containers/1/name", 15),
            // Missing nodes: the nearest existing parent.
            ("/spec/selector", 7),
            ("/spec/template/spec/containers/7/name", 11),
            ("/metadata/name/x", 5),
            ("/spec/template/spec/alias/0", 18),
        ];
        for (pointer, line) in cases {
            assert_eq!(index.line_of(pointer), Some(line), "{pointer}");
        }
    }

    #[test]
    fn t10_documents_after_a_marker_and_bad_text() {
        let index = LineIndex::new("---\n\n--- # c\na: 1\n");
        // The first document is the empty one: its root is the empty scalar.
        assert_eq!(index.line_of("/a"), Some(3));
        assert_eq!(LineIndex::new("--- # c\n\na:\n  b: 1\n").line_of("/a/b"), Some(4));
        assert_eq!(LineIndex::new("a: [1,\n").line_of("/a"), None);
        assert_eq!(LineIndex::new("").line_of(""), None);
    }

    #[test]
    fn t10_first_duplicate_key() {
        let text = "a:\n  b: 1\n  c: 2\nd: [{e: 1, e: 2}]\nd: 3\n";
        assert_eq!(LineIndex::new(text).first_duplicate(), Some((4, 12)));
        assert_eq!(LineIndex::new("a: 1\nb: 2\n").first_duplicate(), None);
    }

    #[test]
    fn t10_pointer_segments() {
        assert_eq!(segments("/a~1b/~0c/0").collect::<Vec<_>>(), ["a/b", "~c", "0"]);
        assert_eq!(segments("").count(), 0);
        assert_eq!(escape("a/b~c"), "a~1b~0c");
    }
}
