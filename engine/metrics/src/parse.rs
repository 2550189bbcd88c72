//! The text exposition format read back: what a scraper sees, for tests and benchmarks.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A scrape: its samples and the declared type of each family.
#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    /// The declared type of family `name`.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.types.get(name).map(String::as_str)
    }

    /// The samples named `name` whose labels include `labels`.
    pub fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|have| have == v))
        })
    }

    /// The value of the first sample named `name` whose labels include `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    /// The sum of the samples named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }
}

/// Parses the text format (version 0.0.4); an error names the line.
pub fn parse(text: &str) -> Result<Scrape, String> {
    let mut scrape = Scrape::default();
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| bad("TYPE without a type"))?;
            scrape.types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| bad("no value"))?;
        let name = &line[..name_end];
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(mut inner) = rest.strip_prefix('{') {
            loop {
                if let Some(after) = inner.strip_prefix('}') {
                    rest = after;
                    break;
                }
                let (key, after) = inner.split_once("=\"").ok_or_else(|| bad("label without a value"))?;
                let mut value = String::new();
                let mut chars = after.char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c)) => value.push(c),
                            None => return Err(bad("unfinished escape")),
                        },
                        Some((i, '"')) => break i,
                        Some((_, c)) => value.push(c),
                        None => return Err(bad("unterminated label value")),
                    }
                };
                labels.insert(key.trim_start_matches(',').to_owned(), value);
                inner = after[end + 1..].trim_start_matches(',');
            }
        }
        let value = rest.split_whitespace().next().ok_or_else(|| bad("no value"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| bad("value is not a number"))?,
        };
        scrape.samples.push(Sample { name: name.to_owned(), labels, value });
    }
    Ok(scrape)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_lines_are_errors() {
        for bad in ["x", "x{a=\"1} 2", "x{a} 1", "x abc", "# TYPE x"] {
            assert!(super::parse(bad).is_err(), "{bad}");
        }
        let scrape = super::parse("x{a=\"1\",b=\"}\"} +Inf 123\ny 2").unwrap();
        assert_eq!(scrape.value("x", &[("b", "}")]), Some(f64::INFINITY));
        assert_eq!(scrape.sum("y", &[]), 2.0);
    }
}
