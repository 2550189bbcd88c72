//! Kubernetes resource quantities (`100m`, `0.5`, `64Mi`, `1G`, `1e3`) as integers.

/// A quantity in thousandths of its unit: `100m` -> 100, `2` -> 2000, `1Ki` -> 1_024_000.
/// `None` for text that is not a quantity.
pub fn parse_milli(text: &str) -> Option<i128> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let negative = int_part.starts_with('-');
    let int_digits = int_part.trim_start_matches(['+', '-']);
    if int_digits.is_empty() && frac_part.is_empty() {
        return None;
    }
    // Work in nano-units so `0.5m` and `1.5` stay exact; round up to milli like Kubernetes.
    let mut nanos: i128 = 0;
    for c in int_digits.chars() {
        nanos = nanos.checked_mul(10)?.checked_add(c.to_digit(10)? as i128)?;
    }
    nanos = nanos.checked_mul(1_000_000_000)?;
    let mut scale = 100_000_000;
    for c in frac_part.chars().take(9) {
        nanos += c.to_digit(10)? as i128 * scale;
        scale /= 10;
    }
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().ok().filter(|e| *e <= 18)?;
            (10i128.pow(exp), 1)
        }
        _ => return None,
    };
    let scaled = nanos.checked_mul(mul)?;
    let milli = (scaled / div + 999_999) / 1_000_000; // nano -> milli, rounding up
    Some(if negative { -milli } else { milli })
}

/// A quantity in whole units, rounded up (`64Mi` -> 67108864, `100m` -> 1).
pub fn parse_units(text: &str) -> Option<i128> {
    parse_milli(text).map(|m| (m + 999).div_euclid(1000))
}

/// `milli` (thousandths) written as the API server writes a quantity back (its canonical
/// form): binary suffixes when `binary` and the value is a whole multiple of 1024, else the
/// largest decimal suffix that keeps it whole, `m` for fractions (`1.5` -> `1500m`).
pub fn format_milli(milli: i128, binary: bool) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let units = milli / 1000;
    if units == 0 {
        return "0".into();
    }
    if binary {
        for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
            if units % (1i128 << shift) == 0 {
                return format!("{}{suffix}", units >> shift);
            }
        }
    }
    for (suffix, exp) in [("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)] {
        let scale = 10i128.pow(exp);
        if units % scale == 0 {
            return format!("{}{suffix}", units / scale);
        }
    }
    units.to_string()
}

/// Whether a quantity's text uses a binary suffix (`Ki` ... `Ei`).
pub fn is_binary(text: &str) -> bool {
    text.trim_end().ends_with('i')
}

/// A quantity's canonical text (`1.5` -> `1500m`, `1024Mi` -> `1Gi`); unparsable text as is.
pub fn canonical(text: &str) -> String {
    parse_milli(text).map_or_else(|| text.to_owned(), |m| format_milli(m, is_binary(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_memory() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_units("64Mi"), Some(64 << 20));
        assert_eq!(parse_units("1G"), Some(1_000_000_000));
        assert_eq!(parse_units("1e3"), Some(1000));
        assert_eq!(parse_units("100m"), Some(1));
        assert_eq!(parse_milli("1u"), Some(1));
    }

    #[test]
    fn canonical_forms_as_the_api_server_writes_them() {
        for (text, canonical_text) in [
            ("1.5", "1500m"),
            ("800m", "800m"),
            ("2", "2"),
            ("1000", "1k"),
            ("1024Mi", "1Gi"),
            ("600Mi", "600Mi"),
            ("500M", "500M"),
            ("0", "0"),
            ("1.5Gi", "1536Mi"),
        ] {
            assert_eq!(canonical(text), canonical_text, "{text}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "abc", "1X", "Mi", "1e99", "1.2.3"] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }
}
