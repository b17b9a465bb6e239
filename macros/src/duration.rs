//! Duration literals: `"250ms"`, `"2s"`, `"1m30s"`, `"1.5s"`, `"24h"`, parsed at compile time.

use std::time::Duration;

/// Why a duration literal does not parse, and what the user most likely meant.
#[derive(Debug)]
pub(crate) struct Bad {
    /// What is wrong, without repeating the literal: "`x` is not a unit".
    reason: String,
    /// The literal the user most likely meant (`"5 sec"` → `"5s"`), when there is a clear one.
    suggestion: Option<String>,
    /// `false` when the fix is not a respelling (the duration is too long).
    respell: bool,
}

impl Bad {
    /// The message for `key = "text"`, telling the user what to write instead.
    pub(crate) fn message(&self, key: &str, text: &str) -> String {
        const UNITS: &str = "units: ns, us, ms, s, m, h, d";
        let given = written(key, &format!("\"{text}\""));
        match &self.suggestion {
            Some(fixed) => format!(
                "`{given}` is not a duration: write `{}` (a number and a unit, no space between; {UNITS})",
                written(key, &format!("\"{fixed}\""))
            ),
            None if self.respell => format!(
                "`{given}` is not a duration: {}; write a number and a unit, such as \
                 `{}`, `\"2s\"`, `\"1m30s\"` or `\"24h\"` ({UNITS})",
                self.reason,
                written(key, "\"250ms\"")
            ),
            None => format!("`{given}`: {}", self.reason),
        }
    }
}

/// How the user writes `value` for the argument `key`: `base = "2s"`, or `wait("2s")` inside
/// `in_progress = wait(...)`.
pub(crate) fn written(key: &str, value: &str) -> String {
    if key == "wait" {
        format!("wait({value})")
    } else {
        format!("{key} = {value}")
    }
}

/// Parses a duration literal: one or more `<number><unit>` parts, units `ns`, `us` (or `µs`),
/// `ms`, `s`, `m`, `h`, `d`; a part's number may have a fraction (`1.5s`).
pub(crate) fn parse(text: &str) -> Result<Duration, Bad> {
    strict(text).map_err(|(reason, respell)| Bad {
        reason,
        suggestion: if respell { suggestion(text) } else { None },
        respell,
    })
}

/// What the user most likely meant by a literal that does not parse: `"5 sec"` and `"5secs"`
/// are `"5s"`, `"2 min"` is `"2m"`. `None` when there is no clear reading.
fn suggestion(text: &str) -> Option<String> {
    let mut fixed = String::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let tail = tail.trim_start();
        let unit_len = tail.find(|c: char| !is_unit_char(c)).unwrap_or(tail.len());
        let (word, tail) = tail.split_at(unit_len);
        if num.is_empty() {
            return None;
        }
        let word = word.to_ascii_lowercase();
        let unit = UNITS
            .iter()
            .find(|u| u.spellings.contains(&word.as_str()) || u.aliases.contains(&word.as_str()))?;
        fixed.push_str(num);
        fixed.push_str(unit.spellings[0]);
        rest = tail.trim_start();
    }
    strict(&fixed).ok().map(|_| fixed)
}

/// A unit of a duration literal.
struct Unit {
    /// How a literal may spell it; the first is how a suggestion writes it.
    spellings: &'static [&'static str],
    /// Nanoseconds in one.
    nanos: u128,
    /// Other spellings (lowercase), which a suggestion reads as this unit.
    aliases: &'static [&'static str],
}

/// Every unit, listed once: what [`strict`] accepts and what [`suggestion`] respells.
const UNITS: [Unit; 7] = [
    Unit {
        spellings: &["ns"],
        nanos: 1,
        aliases: &["nsec", "nsecs", "nanos", "nanosecond", "nanoseconds"],
    },
    Unit {
        // The micro sign, and the Greek mu it is often typed as.
        spellings: &["us", "\u{b5}s", "\u{3bc}s"],
        nanos: 1_000,
        aliases: &["usec", "usecs", "micros", "microsecond", "microseconds"],
    },
    Unit {
        spellings: &["ms"],
        nanos: 1_000_000,
        aliases: &["msec", "msecs", "millis", "millisecond", "milliseconds"],
    },
    Unit {
        spellings: &["s"],
        nanos: 1_000_000_000,
        aliases: &["sec", "secs", "second", "seconds"],
    },
    Unit {
        spellings: &["m"],
        nanos: 60_000_000_000,
        aliases: &["min", "mins", "minute", "minutes"],
    },
    Unit {
        spellings: &["h"],
        nanos: 3_600_000_000_000,
        aliases: &["hr", "hrs", "hour", "hours"],
    },
    Unit {
        spellings: &["d"],
        nanos: 86_400_000_000_000,
        aliases: &["day", "days"],
    },
];

/// A letter of a unit: ASCII, or the `µ` of `µs` (the micro sign, or the Greek mu it is often
/// typed as).
fn is_unit_char(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '\u{b5}' || c == '\u{3bc}'
}

/// The parser proper. On failure: the reason, and whether a respelling can fix it.
fn strict(text: &str) -> Result<Duration, (String, bool)> {
    let too_long = || {
        (
            "it is too long a duration (the most is about 584 billion years)".to_owned(),
            false,
        )
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(("it is empty".to_owned(), true));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail.find(|c: char| !is_unit_char(c)).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        if num.is_empty() {
            return Err((format!("expected a number before `{}`", rest), true));
        }
        let nanos_per = match UNITS.iter().find(|u| u.spellings.contains(&unit)) {
            Some(known) => known.nanos,
            None if unit.is_empty() => return Err((format!("`{num}` has no unit"), true)),
            None => return Err((format!("`{unit}` is not a unit"), true)),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err((format!("`{num}` is not a number"), true));
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_long())?
        };
        let mut part = int.checked_mul(nanos_per).ok_or_else(too_long)?;
        let mut scale = nanos_per;
        for digit in frac.bytes().take(30) {
            scale /= 10;
            part += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = tail;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Renders a duration the way a person writes it, for messages: `500ms`, `8s`, `1m30s`.
pub(crate) fn show(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        let s = d.as_secs();
        match (s / 3600, s % 3600 / 60, s % 60) {
            (0, 0, s) => format!("{s}s"),
            (0, m, 0) => format!("{m}m"),
            (0, m, s) => format!("{m}m{s}s"),
            (h, 0, 0) => format!("{h}h"),
            _ => format!("{s}s"),
        }
    } else if d.subsec_nanos().is_multiple_of(1_000_000) && d.as_secs() == 0 {
        format!("{}ms", d.subsec_millis())
    } else {
        format!("{d:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good() {
        let ms = |s| parse(s).unwrap().as_millis();
        assert_eq!(ms("250ms"), 250);
        assert_eq!(ms("2s"), 2000);
        assert_eq!(ms("1m30s"), 90_000);
        assert_eq!(ms("1.5s"), 1500);
        assert_eq!(ms("24h"), 86_400_000);
        assert_eq!(ms("0s"), 0);
        assert_eq!(parse("10us").unwrap(), Duration::from_micros(10));
    }

    #[test]
    fn micro_sign() {
        // The micro sign (U+00B5) and the Greek mu (U+03BC) look alike; both spell micros.
        assert_eq!(parse("5\u{b5}s").unwrap(), Duration::from_micros(5));
        assert_eq!(parse("5\u{3bc}s").unwrap(), Duration::from_micros(5));
        assert_eq!(parse("5us").unwrap(), Duration::from_micros(5));
        assert_eq!(parse("1ms250µs").unwrap(), Duration::from_micros(1250));
        assert_eq!(parse("1.5µs").unwrap(), Duration::from_nanos(1500));
        let why = |s| parse(s).unwrap_err().message("base", s);
        assert!(
            why("5 µs").contains("write `base = \"5us\"`"),
            "{}",
            why("5 µs")
        );
        assert!(why("5µ").contains("`µ` is not a unit"), "{}", why("5µ"));
    }

    #[test]
    fn bad() {
        for s in [
            "",
            "5",
            "ms",
            "5 sec",
            "5x",
            "1..5s",
            "-1s",
            "99999999999999999999999999999999999999d",
        ] {
            assert!(parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn suggests_the_spelling_meant() {
        let why = |s| parse(s).unwrap_err().message("base", s);
        assert_eq!(
            why("5 sec"),
            "`base = \"5 sec\"` is not a duration: write `base = \"5s\"` (a number and a unit, no space between; units: ns, us, ms, s, m, h, d)"
        );
        assert!(why("2 minutes").contains("write `base = \"2m\"`"));
        assert!(why("1m 30s").contains("write `base = \"1m30s\"`"));
        assert!(why("250 ms").contains("write `base = \"250ms\"`"));
        assert!(why("fast").starts_with("`base = \"fast\"` is not a duration: expected a number before `fast`; write a number and a unit"));
        assert!(why("5").contains("`5` has no unit"));
        assert!(why("5x").contains("`x` is not a unit"));
        assert!(why("99999999999999999999999999999999999999d").contains("too long"));
    }

    #[test]
    fn shows() {
        assert_eq!(show(Duration::from_millis(500)), "500ms");
        assert_eq!(show(Duration::from_secs(8)), "8s");
        assert_eq!(show(Duration::from_secs(90)), "1m30s");
    }
}
