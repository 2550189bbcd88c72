//! Templates: `*.yaml.j2` / `*.yml.j2` files are minijinja templates, rendered with the
//! Application's values, then parsed and validated like any manifest.
//!
//! Decisions, and why:
//! - Values are the root of the template context (`{{ replicas }}`, `{{ image.tag }}`): the
//!   `valuesFiles` merged in order, then `values` on top; mappings merge deeply, anything else
//!   is replaced.
//! - Undefined is strict: a typo must fail the commit, not render an empty string. `is defined`
//!   and `| default(...)` still work.
//! - No loader: a template cannot include, import or extend another file. It sees nothing but
//!   its own text and the values, so its output depends on (its blob, the values) alone, which
//!   is what the cache keys it by.
//! - Bounded: an output cap (4 times the per-file limit) and fuel (minijinja's budget of
//!   instructions and bytes) proportional to it, so a push cannot make the control plane loop
//!   or allocate without end.
//! - No auto-escaping (minijinja would JSON-escape `.yaml` names): output is YAML that the
//!   author writes; `| tojson` quotes a value safely.
//! - `trim_blocks` and `lstrip_blocks`, as Ansible sets them: block tags on their own lines leave
//!   no blank lines or stray indentation in the YAML.
//! - Errors never quote a value (values may be secrets): only the template's own text, and the
//!   template line. Rendered lines are mapped back to the template lines that wrote them (from
//!   minijinja's output spans), so errors in the output point into the template too.

use crate::{Limits, ManifestError, error::MASK, manifest::LineMap};
use minijinja::{
    AutoEscape, Environment, ErrorKind, OutputSpan, OutputSpanKind, UndefinedBehavior, syntax::SyntaxConfig,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::{collections::BTreeMap, fmt};

/// Suffixes of template files.
const SUFFIXES: [&str; 2] = [".yaml.j2", ".yml.j2"];
/// How many times the per-file limit one template may render to.
const OUTPUT_FACTOR: u64 = 4;
/// Fuel per 64 bytes of the output cap: minijinja charges about one fuel per 64 bytes of data
/// and one per instruction, so this leaves room for about 16 instructions per output chunk.
const FUEL_PER_CHUNK: u64 = 16;
/// Fuel however small the limits: enough for templates of a few hundred objects.
const MIN_FUEL: u64 = 100_000;
/// Values shorter than this are not masked in template errors: they would mask common words
/// and numbers of the message, and are too short to be secrets.
const MIN_MASKED: usize = 4;

/// Whether the file at `path` is a template.
pub fn is_template(path: &str) -> bool {
    SUFFIXES.iter().any(|s| path.ends_with(s))
}

/// The largest output of one template.
pub(crate) fn max_output(limits: &Limits) -> u64 {
    limits.max_file_bytes.saturating_mul(OUTPUT_FACTOR)
}

/// Merges `over` into `base`: mappings key by key, recursively; anything else replaces.
pub fn merge_values(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(existing) => merge_values(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// Sets one `--set key.path=value` in `values`. The value is read as YAML (`3` is a number,
/// `true` a boolean, `[a, b]` a list), or taken as a string when it is not valid YAML; an empty
/// value is the empty string.
pub fn set_value(values: &mut BTreeMap<String, Value>, assignment: &str) -> Result<(), String> {
    let Some((path, raw)) = assignment.split_once('=') else {
        return Err(format!("{assignment:?} is not key=value: write e.g. --set image.tag=v2"));
    };
    let keys: Vec<&str> = path.split('.').collect();
    if keys.iter().any(|k| k.trim().is_empty()) {
        return Err(format!("{path:?} is not a key path: write keys separated by dots, e.g. image.tag"));
    }
    let value = match raw {
        "" => Value::String(String::new()),
        raw => serde_yaml::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.to_owned())),
    };
    // Built from the innermost key out, then merged: `a.b=1` keeps a's other keys.
    let mut nested = value;
    for key in keys.iter().skip(1).rev() {
        nested = Value::Object(Map::from_iter([((*key).to_owned(), nested)]));
    }
    let first = keys[0].to_owned();
    match values.get_mut(&first) {
        Some(existing) => merge_values(existing, nested),
        None => {
            values.insert(first, nested);
        }
    }
    Ok(())
}

/// The values templates are rendered with, merged, with a digest that keys cached renders.
pub(crate) struct Values {
    pub(crate) digest: [u8; 32],
    context: minijinja::Value,
    /// The string values, longest first, masked in any message (defense in depth: minijinja's
    /// messages name types and expressions, not values, but a few name operands).
    masked: Vec<String>,
}

// Values may hold secrets.
impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Values").field("digest", &hex(&self.digest)).finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Values {
    pub(crate) fn new(merged: &Value) -> Self {
        // serde_json's map is sorted by key, so equal values give equal bytes.
        let digest = Sha256::digest(serde_json::to_vec(merged).unwrap_or_default()).into();
        let mut masked = Vec::new();
        collect_strings(merged, &mut masked);
        masked.sort_by_key(|s| std::cmp::Reverse(s.len()));
        masked.dedup();
        Values { digest, context: minijinja::Value::from(minijinja::value::Serde(merged)), masked }
    }

    /// `message` with every value masked.
    fn mask(&self, message: &str) -> String {
        let mut message = message.to_owned();
        for value in &self.masked {
            if message.contains(value.as_str()) {
                message = message.replace(value.as_str(), MASK);
            }
        }
        message
    }
}

fn collect_strings(value: &Value, out: &mut Vec<String>) {
    // An explicit stack: values come from Git too.
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) if s.len() >= MIN_MASKED => out.push(s.clone()),
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
}

/// A template's output, with the template line of each output line.
pub(crate) struct Rendered {
    pub(crate) text: String,
    pub(crate) lines: LineMap,
}

/// Renders the template `source` of the file at `path` with `values`, within the limits.
pub(crate) fn render(
    path: &str,
    source: &str,
    values: &Values,
    limits: &Limits,
) -> Result<Rendered, Box<ManifestError>> {
    let cap = max_output(limits);
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Debug mode makes minijinja track which expression was undefined (`image.tag`). It also
    // attaches the values of nearby variables to errors: `render_error` never shows those.
    env.set_debug(true);
    env.set_fuel(Some((cap / 64).saturating_mul(FUEL_PER_CHUNK).max(MIN_FUEL)));
    let syntax = SyntaxConfig::builder().keep_trailing_newline(true).trim_blocks(true).lstrip_blocks(true).build();
    match syntax {
        Ok(syntax) => env.set_syntax(syntax),
        Err(e) => return Err(render_error(path, &e, values)),
    }
    let template = env.template_from_named_str(path, source).map_err(|e| render_error(path, &e, values))?;
    let (text, spans) =
        template.render_with_spans(values.context.clone()).map_err(|e| render_error(path, &e, values))?;
    if text.len() as u64 > cap {
        return Err(Box::new(ManifestError::new(
            path,
            format!(
                "renders to {}, over the limit of {} per template (4 times the limit per manifest file): \
                 split it into several templates",
                crate::human_bytes(text.len() as u64),
                crate::human_bytes(cap)
            ),
        )));
    }
    let lines = line_map(&text, source, &spans);
    Ok(Rendered { text, lines })
}

/// A render error as users read it: the template line, what is wrong, what to do, and no value.
fn render_error(path: &str, e: &minijinja::Error, values: &Values) -> Box<ManifestError> {
    let detail = e.detail().map(|detail| {
        // The one message that quotes operands: an arithmetic overflow.
        if detail.starts_with("unable to calculate") {
            "unable to calculate: the result is out of range".to_owned()
        } else {
            values.mask(detail)
        }
    });
    let (what, hint) = match e.kind() {
        ErrorKind::UndefinedError => (
            "undefined value",
            Some("set it in the Application's values or valuesFiles, or give a default: {{ name | default(\"x\") }}"),
        ),
        ErrorKind::SyntaxError => ("template syntax error", None),
        ErrorKind::OutOfFuel => {
            ("the template does too much work", Some("simplify its loops, or split it into several templates"))
        }
        ErrorKind::TemplateNotFound | ErrorKind::UnknownFunction
            if detail.as_deref().is_some_and(|d| d.contains("include") || d.contains("template")) =>
        {
            ("template error", Some("templates cannot include, import or extend other files"))
        }
        _ => ("template error", None),
    };
    let mut message = match &detail {
        Some(detail) => format!("{what}: {detail}"),
        None => format!("{what}: {}", e.kind()),
    };
    if let Some(hint) = hint {
        message.push_str(": ");
        message.push_str(hint);
    }
    let mut error = ManifestError::new(path, message);
    error.line = e.line();
    Box::new(error)
}

/// For each line of `output`, the line of `source` that wrote it: a verbatim span maps one to
/// one, an expression's output maps to the expression's line.
fn line_map(output: &str, source: &str, spans: &[OutputSpan]) -> LineMap {
    let mut lines = Vec::new();
    let mut span = 0;
    let mut last = 1u32;
    let mut start = 0;
    while start < output.len() || (start == 0 && lines.is_empty()) {
        while spans.get(span).is_some_and(|s| s.output_range().end <= start) {
            span += 1;
        }
        let line = spans
            .get(span)
            .filter(|s| s.output_range().contains(&start))
            .map(|s| source_line(s, start, source))
            .map_or(last, |l| u32::try_from(l).unwrap_or(u32::MAX));
        lines.push(line);
        last = line;
        match output[start..].find('\n') {
            Some(newline) => start += newline + 1,
            None => break,
        }
    }
    // The end of output that ends a line: the next line, as a parser reports it for a plain file.
    if output.ends_with('\n') {
        lines.push(last.saturating_add(1));
    }
    lines.into()
}

/// The source line of output byte `at`, inside `span`.
fn source_line(span: &OutputSpan, at: usize, source: &str) -> usize {
    match span.kind() {
        OutputSpanKind::Raw => {
            let from = span.source_range().start;
            let to = from + (at - span.output_range().start);
            let newlines = source.get(from..to).map_or(0, |s| s.bytes().filter(|&b| b == b'\n').count());
            span.line() + newlines
        }
        _ => span.line(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn values(v: Value) -> Values {
        Values::new(&v)
    }

    fn render_ok(source: &str, v: Value) -> (String, Vec<u32>) {
        let r = render("t.yaml.j2", source, &values(v), &Limits::default()).unwrap();
        (r.text, r.lines.to_vec())
    }

    fn render_err(source: &str, v: Value) -> String {
        match render("t.yaml.j2", source, &values(v), &Limits::default()) {
            Ok(r) => panic!("rendered {:?}", r.text),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn t10_renders_values_without_escaping() {
        let source = "name: {{ name }}\n{% for p in ports %}\n- {{ p }}\n{% endfor %}\nq: {{ quote | tojson }}\n";
        let (text, lines) = render_ok(source, json!({"name": "<web>", "ports": [80, 443], "quote": "a: b"}));
        assert_eq!(text, "name: <web>\n- 80\n- 443\nq: \"a: b\"\n");
        // Each output line points at the template line that wrote it.
        assert_eq!(lines, [1, 3, 3, 5, 6]);
    }

    #[test]
    fn t10_undefined_values_and_syntax_errors_name_the_line() {
        let cases = [
            (
                "a: 1\nb: {{ replicas }}\n",
                "t.yaml.j2:2: undefined value: `replicas` is undefined: set it in the Application's values or \
                 valuesFiles, or give a default: {{ name | default(\"x\") }}",
            ),
            (
                "a: {{ image.tag }}\n",
                "t.yaml.j2:1: undefined value: `image.tag` is undefined: set it in the Application's values or \
                 valuesFiles, or give a default: {{ name | default(\"x\") }}",
            ),
            (
                "a: 1\n{% if x %}\nb: 2\n",
                "t.yaml.j2:3: template syntax error: unexpected end of input, expected end of block",
            ),
            ("{% include 'other.yaml.j2' %}", "t.yaml.j2:1: template syntax error: unknown statement include"),
        ];
        for (source, expected) in cases {
            assert_eq!(render_err(source, json!({"image": {}, "x": true})), expected, "{source}");
        }
        let (text, _) = render_ok("a: {{ missing | default('d') }}\n{% if other is defined %}x{% endif %}", json!({}));
        assert_eq!(text, "a: d\n");
    }

    #[test]
    fn t10_errors_never_quote_values() {
        let secret = json!({"password": "hunter2-very-secret", "n": 9_223_372_036_854_775_807i64});
        for source in
            ["{{ password + 1 }}", "{{ n // 0 }}", "{{ n % 0 }}", "{{ password | int }}", "{{ password.x.y }}"]
        {
            let message = render_err(source, secret.clone());
            assert!(!message.contains("hunter2"), "{source}: {message}");
            assert!(!message.contains("9223372036854775807"), "{source}: {message}");
        }
        assert!(!format!("{:?}", values(secret)).contains("hunter2"));
    }

    #[test]
    fn t10_output_and_work_are_bounded() {
        let limits = Limits { max_file_bytes: 1024, ..Limits::default() };
        let big = "{% for i in range(200) %}line {{ i }} of a template that renders far too much\n{% endfor %}";
        let e = render("big.yaml.j2", big, &values(json!({})), &limits).err().unwrap().to_string();
        assert!(e.starts_with("big.yaml.j2: renders to ") && e.contains("over the limit of 4 KiB per template"), "{e}");

        let busy = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
        let e = render("busy.yaml.j2", busy, &values(json!({})), &limits).err().unwrap().to_string();
        assert!(e.starts_with("busy.yaml.j2:1: the template does too much work"), "{e}");
    }

    #[test]
    fn t10_merge_and_set() {
        let mut base = json!({"image": {"repo": "r", "tag": "1"}, "list": [1, 2], "keep": true});
        merge_values(&mut base, json!({"image": {"tag": "2"}, "list": [3]}));
        assert_eq!(base, json!({"image": {"repo": "r", "tag": "2"}, "list": [3], "keep": true}));

        let mut values = BTreeMap::new();
        for set in ["replicas=3", "image.tag=v2", "image.pull=true", "name=web", "ports=[80, 443]", "empty=", "s=a: b"]
        {
            set_value(&mut values, set).unwrap();
        }
        assert_eq!(
            Value::Object(values.clone().into_iter().collect()),
            json!({"replicas": 3, "image": {"tag": "v2", "pull": true}, "name": "web", "ports": [80, 443], "empty": "", "s": {"a": "b"}})
        );
        assert!(set_value(&mut values, "novalue").unwrap_err().contains("is not key=value"));
        assert!(set_value(&mut values, "a..b=1").unwrap_err().contains("is not a key path"));
    }

    #[test]
    fn t10_template_names() {
        assert!(is_template("a/b.yaml.j2") && is_template("b.yml.j2"));
        assert!(!is_template("b.yaml") && !is_template("b.j2") && !is_template("b.json.j2"));
    }
}
