//! A CronJob's `schedule` as the CronJob controller reads it (robfig/cron's standard parser:
//! five fields `minute hour day-of-month month day-of-week`, names `jan`..`dec` and `sun`..`sat`,
//! `*`, `?`, ranges, lists, steps, the descriptors `@yearly` .. `@hourly` and `@every <duration>`)
//! and its next times in a time zone, found by robfig's walk so that daylight saving time behaves
//! as upstream: a time skipped by a spring-forward does not run that day; a time in the hour a
//! fall-back repeats runs twice. Pure: the time zone is given.

use jiff::{Timestamp, ToSpan, Zoned, civil, tz::TimeZone};

/// Bit 63 of a day field: written as `*` or `?`, which changes how day-of-month and
/// day-of-week combine (both must match, instead of either).
const STAR: u64 = 1 << 63;

/// One field's bounds and names.
struct Bounds {
    what: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTES: Bounds = Bounds { what: "minute", min: 0, max: 59, names: &[] };
const HOURS: Bounds = Bounds { what: "hour", min: 0, max: 23, names: &[] };
const DAYS: Bounds = Bounds { what: "day of month", min: 1, max: 31, names: &[] };
const MONTHS: Bounds = Bounds {
    what: "month",
    min: 1,
    max: 12,
    names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
};
const WEEKDAYS: Bounds =
    Bounds { what: "day of week", min: 0, max: 6, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// `@every <duration>`: this many whole seconds after the previous time.
    Every(i64),
    /// The five fields as bit sets (bit n: value n matches).
    Fields { minute: u64, hour: u64, day: u64, month: u64, weekday: u64 },
}

/// Parses a schedule, or says what is wrong with it in robfig/cron's words.
pub fn parse(spec: &str) -> Result<Schedule, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("empty spec string".into());
    }
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        return Err("cannot use TZ or CRON_TZ in schedule, use the timeZone field instead".into());
    }
    if let Some(descriptor) = spec.strip_prefix('@') {
        let fields = match descriptor {
            "yearly" | "annually" => "0 0 1 1 *",
            "monthly" => "0 0 1 * *",
            "weekly" => "0 0 * * 0",
            "daily" | "midnight" => "0 0 * * *",
            "hourly" => "0 * * * *",
            _ => {
                let Some(duration) = descriptor.strip_prefix("every ") else {
                    return Err(format!("unrecognized descriptor: {spec}"));
                };
                let seconds = parse_duration(duration.trim())
                    .ok_or_else(|| format!("failed to parse duration {spec}: write it as 90s, 5m or 1h30m"))?;
                return Ok(Schedule::Every(seconds.max(1)));
            }
        };
        return parse(fields);
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    let [minute, hour, day, month, weekday] = fields[..] else {
        return Err(format!("expected exactly 5 fields, found {}: {spec}", fields.len()));
    };
    Ok(Schedule::Fields {
        minute: field(minute, &MINUTES)?,
        hour: field(hour, &HOURS)?,
        day: field(day, &DAYS)?,
        month: field(month, &MONTHS)?,
        weekday: field(weekday, &WEEKDAYS)?,
    })
}

/// Whole seconds of a Go duration made of `h`, `m`, `s` parts (`1h30m`, `90s`); sub-second
/// parts are dropped, as robfig rounds `@every` down to the second.
fn parse_duration(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let number: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "h" => 3600,
            "m" => 60,
            "s" => 1,
            "ms" | "us" | "µs" | "ns" => 0,
            _ => return None,
        };
        total = total.checked_add(number.checked_mul(factor)?)?;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// One field: comma-separated ranges, each `*`, `?`, `n`, `a-b`, with an optional `/step`.
fn field(text: &str, bounds: &Bounds) -> Result<u64, String> {
    text.split(',').try_fold(0, |bits, range| Ok(bits | self::range(range, bounds)?))
}

fn range(expr: &str, bounds: &Bounds) -> Result<u64, String> {
    let wrong = |why: String| Err(format!("{why}: {expr} ({})", bounds.what));
    let (span, step) = match expr.split('/').collect::<Vec<_>>()[..] {
        [span] => (span, None),
        [span, step] => (span, Some(step)),
        _ => return wrong("too many slashes".into()),
    };
    let ends: Vec<&str> = span.split('-').collect();
    let (start, mut end, mut extra) = if ends[0] == "*" || ends[0] == "?" {
        (bounds.min, bounds.max, STAR)
    } else {
        let start = number(ends[0], bounds)?;
        match ends[..] {
            [_] => (start, start, 0),
            [_, high] => (start, number(high, bounds)?, 0),
            _ => return wrong("too many hyphens".into()),
        }
    };
    let step = match step {
        None => 1,
        Some(step) => {
            let step = number(step, &Bounds { names: &[], ..*bounds })?;
            if ends.len() == 1 {
                end = bounds.max; // `5/15` means `5-max/15`
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
    };
    if start < bounds.min {
        return wrong(format!("beginning of range ({start}) below minimum ({})", bounds.min));
    }
    if end > bounds.max {
        return wrong(format!("end of range ({end}) above maximum ({})", bounds.max));
    }
    if start > end {
        return wrong(format!("beginning of range ({start}) beyond end of range ({end})"));
    }
    if step == 0 {
        return wrong("step of range should be a positive number".into());
    }
    Ok((start..=end).step_by(step as usize).fold(extra, |bits, n| bits | (1 << n)))
}

fn number(text: &str, bounds: &Bounds) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = bounds.names.iter().position(|name| *name == lower) {
        return Ok(i as u32 + bounds.min);
    }
    text.parse::<u32>().map_err(|_| format!("failed to parse int from {text} ({})", bounds.what))
}

impl Schedule {
    /// The first scheduled time strictly after `after`, as seen in `tz`; none within five years.
    pub fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        // Scheduled times fall on whole seconds: start at the next one.
        let start = Timestamp::from_second(after.as_second().checked_add(1)?).ok()?;
        match *self {
            Schedule::Every(seconds) => Timestamp::from_second(after.as_second().checked_add(seconds)?).ok(),
            Schedule::Fields { minute, hour, day, month, weekday } => {
                let f = Fields { minute, hour, day, month, weekday };
                f.next(start.to_zoned(tz.clone())).map(|z| z.timestamp())
            }
        }
    }
}

struct Fields {
    minute: u64,
    hour: u64,
    day: u64,
    month: u64,
    weekday: u64,
}

fn has(bits: u64, n: i8) -> bool {
    bits & (1 << n) != 0
}

fn at(date: civil::Date, hour: i8, tz: &TimeZone) -> Option<Zoned> {
    date.at(hour, 0, 0, 0).to_zoned(tz.clone()).ok()
}

impl Fields {
    fn day_matches(&self, t: &Zoned) -> bool {
        let day = has(self.day, t.day());
        let weekday = has(self.weekday, t.weekday().to_sunday_zero_offset());
        if self.day & STAR != 0 || self.weekday & STAR != 0 { day && weekday } else { day || weekday }
    }

    /// robfig/cron's `SpecSchedule.Next`: advance the largest field that does not match, reset
    /// the smaller ones on the first advance, start again when a field wraps.
    fn next(&self, mut t: Zoned) -> Option<Zoned> {
        let tz = t.time_zone().clone();
        let mut added = false;
        let year_limit = t.year() + 5;
        'wrap: loop {
            if t.year() > year_limit {
                return None;
            }
            while !has(self.month, t.month()) {
                if !added {
                    added = true;
                    t = at(civil::date(t.year(), t.month(), 1), 0, &tz)?;
                }
                t = t.checked_add(1.month()).ok()?;
                if t.month() == 1 {
                    continue 'wrap;
                }
            }
            while !self.day_matches(&t) {
                if !added {
                    added = true;
                    t = at(t.date(), 0, &tz)?;
                }
                t = t.checked_add(1.day()).ok()?;
                // A day that starts at 01:00 or 23:00 because of DST: back to midnight, as robfig.
                let hour = i64::from(t.hour());
                if hour > 12 {
                    t = t.checked_add((24 - hour).hours()).ok()?;
                } else if hour != 0 {
                    t = t.checked_sub(hour.hours()).ok()?;
                }
                if t.day() == 1 {
                    continue 'wrap;
                }
            }
            while !has(self.hour, t.hour()) {
                if !added {
                    added = true;
                    t = at(t.date(), t.hour(), &tz)?;
                }
                t = t.checked_add(1.hour()).ok()?;
                if t.hour() == 0 {
                    continue 'wrap;
                }
            }
            while !has(self.minute, t.minute()) {
                if !added {
                    added = true;
                    t = truncate(&t, 60)?;
                }
                t = t.checked_add(1.minute()).ok()?;
                if t.minute() == 0 {
                    continue 'wrap;
                }
            }
            if t.second() != 0 {
                // The standard parser's seconds field is 0: the next whole minute.
                t = truncate(&t, 60)?.checked_add(1.minute()).ok()?;
                if t.minute() == 0 {
                    continue 'wrap;
                }
                continue;
            }
            return Some(t);
        }
    }
}

/// `t` rounded down to a multiple of `seconds` of absolute time (Go's `Time.Truncate`).
fn truncate(t: &Zoned, seconds: i64) -> Option<Zoned> {
    let s = t.timestamp().as_second();
    Some(Timestamp::from_second(s - s.rem_euclid(seconds)).ok()?.to_zoned(t.time_zone().clone()))
}

/// The time zone a CronJob names in `timeZone` (an IANA name, read from the system's tz
/// database as Go's `time.LoadLocation` does); none means UTC.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name {
        None => Ok(TimeZone::UTC),
        Some(name) if name.is_empty() || name.starts_with('/') || name.contains("..") => {
            Err(format!("unknown time zone {name:?}: use an IANA name such as Europe/Berlin or Etc/UTC"))
        }
        Some(name) => jiff::tz::db()
            .get(name)
            .map_err(|_| format!("unknown time zone {name:?}: use an IANA name such as Europe/Berlin or Etc/UTC")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// Next times as RFC 3339 with the zone's offset, for readable tables.
    fn nexts(spec: &str, zone: &str, after: &str, count: usize) -> Vec<String> {
        let schedule = parse(spec).unwrap();
        let tz = time_zone(Some(zone)).unwrap();
        let mut t = ts(after);
        let mut out = Vec::new();
        for _ in 0..count {
            t = schedule.next(t, &tz).unwrap();
            out.push(t.to_zoned(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string());
        }
        out
    }

    #[test]
    fn next_times_table() {
        #[rustfmt::skip]
        let cases: Vec<(&str, &str, &str, Vec<&str>)> = vec![
            ("*/1 * * * *", "UTC", "2026-01-01T00:00:30Z", vec!["2026-01-01T00:01:00+00:00", "2026-01-01T00:02:00+00:00"]),
            ("*/15 * * * *", "UTC", "2026-01-01T00:00:00Z", vec!["2026-01-01T00:15:00+00:00", "2026-01-01T00:30:00+00:00"]),
            ("5/20 * * * *", "UTC", "2026-01-01T00:00:00Z", vec!["2026-01-01T00:05:00+00:00", "2026-01-01T00:25:00+00:00"]),
            ("0 9-17/4 * * mon-fri", "UTC", "2026-01-02T10:00:00Z", vec!["2026-01-02T13:00:00+00:00", "2026-01-02T17:00:00+00:00", "2026-01-05T09:00:00+00:00"]),
            ("@hourly", "UTC", "2026-01-01T00:59:59Z", vec!["2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00+00:00"]),
            ("@daily", "Europe/Berlin", "2026-01-01T00:00:00Z", vec!["2026-01-02T00:00:00+01:00"]),
            ("@weekly", "UTC", "2026-01-01T00:00:00Z", vec!["2026-01-04T00:00:00+00:00", "2026-01-11T00:00:00+00:00"]),
            ("@monthly", "UTC", "2026-01-15T00:00:00Z", vec!["2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00"]),
            ("@yearly", "UTC", "2026-01-15T00:00:00Z", vec!["2027-01-01T00:00:00+00:00"]),
            ("@every 90s", "UTC", "2026-01-01T00:00:00.5Z", vec!["2026-01-01T00:01:30+00:00", "2026-01-01T00:03:00+00:00"]),
            // Day of month or day of week when both are restricted; both when one is `*`.
            ("0 0 13 * fri", "UTC", "2026-01-01T00:00:00Z", vec!["2026-01-02T00:00:00+00:00", "2026-01-09T00:00:00+00:00", "2026-01-13T00:00:00+00:00"]),
            ("0 0 13 * *", "UTC", "2026-01-01T00:00:00Z", vec!["2026-01-13T00:00:00+00:00", "2026-02-13T00:00:00+00:00"]),
            ("0 0 31 * *", "UTC", "2026-01-31T12:00:00Z", vec!["2026-03-31T00:00:00+00:00", "2026-05-31T00:00:00+00:00"]),
            ("0 0 29 feb *", "UTC", "2026-01-01T00:00:00Z", vec!["2028-02-29T00:00:00+00:00"]),
            // A time zone's wall clock.
            ("30 8 * * *", "America/New_York", "2026-01-01T00:00:00Z", vec!["2026-01-01T08:30:00-05:00"]),
            ("0 9 * * *", "Asia/Kolkata", "2026-01-01T00:00:00Z", vec!["2026-01-01T09:00:00+05:30", "2026-01-02T09:00:00+05:30"]),
            // Spring forward (New York, 2026-03-08 02:00 -> 03:00): 02:30 does not exist that day.
            ("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", vec!["2026-03-09T02:30:00-04:00"]),
            ("0 * * * *", "America/New_York", "2026-03-08T05:30:00Z", vec!["2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00"]),
            // Fall back (2026-11-01 02:00 -> 01:00): what falls in the repeated hour runs twice.
            ("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", vec!["2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00", "2026-11-02T01:30:00-05:00"]),
            ("30 2 * * *", "America/New_York", "2026-10-31T12:00:00Z", vec!["2026-11-01T02:30:00-05:00"]),
            ("0 * * * *", "America/New_York", "2026-11-01T04:30:00Z", vec!["2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00"]),
            ("0 0 * * *", "Europe/London", "2026-03-28T12:00:00Z", vec!["2026-03-29T00:00:00+00:00", "2026-03-30T00:00:00+01:00"]),
        ];
        for (spec, zone, after, want) in cases {
            assert_eq!(nexts(spec, zone, after, want.len()), want, "{spec} in {zone} after {after}");
        }
    }

    #[test]
    fn parse_errors_table() {
        let cases = [
            ("", "empty spec string"),
            ("* * * *", "expected exactly 5 fields, found 4: * * * *"),
            ("60 * * * *", "end of range (60) above maximum (59): 60 (minute)"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0 (day of month)"),
            ("* * * * 7", "end of range (7) above maximum (6): 7 (day of week)"),
            ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1 (minute)"),
            ("*/0 * * * *", "step of range should be a positive number: */0 (minute)"),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3 (minute)"),
            ("*/2/3 * * * *", "too many slashes: */2/3 (minute)"),
            ("* * * foo *", "failed to parse int from foo (month)"),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
            ("@every 5x", "failed to parse duration @every 5x: write it as 90s, 5m or 1h30m"),
            ("CRON_TZ=UTC * * * * *", "cannot use TZ or CRON_TZ in schedule, use the timeZone field instead"),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(spec), Err(want.to_owned()), "{spec:?}");
        }
        for spec in
            ["* * * * *", "0,30 */2 1-15 JAN-jun Mon-Fri", "? ? ? ? ?", "@annually", "@midnight", "@every 1h30m"]
        {
            assert!(parse(spec).is_ok(), "{spec}");
        }
    }

    #[test]
    fn time_zones() {
        assert_eq!(time_zone(None).unwrap(), TimeZone::UTC);
        assert!(time_zone(Some("Europe/Berlin")).is_ok());
        for bad in ["Mars/Olympus", "", "/etc/passwd", "../../etc/passwd"] {
            assert!(time_zone(Some(bad)).unwrap_err().contains("unknown time zone"), "{bad}");
        }
    }
}
