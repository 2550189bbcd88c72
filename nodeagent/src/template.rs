//! Rendering of the minijinja templates embedded from `templates/`.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};

/// Renders `source` with `ctx`. Undefined variables are errors (a typo must not render as an
/// empty string), and the `quote` filter makes a JSON string, which is also a valid TOML basic
/// string, so paths with quotes or backslashes cannot break the file.
pub(crate) fn render(name: &str, source: &str, ctx: Value) -> Result<String, Error> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_syntax(SyntaxConfig::builder().keep_trailing_newline(true).build()?);
    env.add_filter("quote", quote);
    env.render_named_str(name, source, ctx)
}

fn quote(value: String) -> Result<Value, Error> {
    serde_json::to_string(&value)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}
