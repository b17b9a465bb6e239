//! Duration literals: `"250ms"`, `"2s"`, `"1m30s"`, `"1.5s"`, `"24h"`, parsed at compile time.

use std::time::Duration;

/// Parses a duration literal: one or more `<number><unit>` parts, units `ns`, `us`, `ms`, `s`,
/// `m`, `h`, `d`; a part's number may have a fraction (`1.5s`). Returns the reason on failure.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    const HELP: &str = "write a number and a unit, such as \"250ms\", \"2s\", \"1m30s\" or \"24h\" (units: ns, us, ms, s, m, h, d)";
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("empty duration; {HELP}"));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        if num.is_empty() {
            return Err(format!("`{text}` is not a duration: expected a number before `{unit}{tail}`; {HELP}"));
        }
        let nanos_per: u128 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => return Err(format!("`{text}` has no unit after `{num}`; {HELP}")),
            other => return Err(format!("unknown unit `{other}` in `{text}`; {HELP}")),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(format!("`{num}` is not a number in `{text}`; {HELP}"));
        }
        let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| format!("`{text}` is too long a duration"))? };
        let mut part = int.checked_mul(nanos_per).ok_or_else(|| format!("`{text}` is too long a duration"))?;
        let mut scale = nanos_per;
        for digit in frac.bytes().take(30) {
            scale /= 10;
            part += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(part).ok_or_else(|| format!("`{text}` is too long a duration"))?;
        rest = tail;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| format!("`{text}` is too long a duration"))?;
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
    } else if d.subsec_nanos() % 1_000_000 == 0 && d.as_secs() == 0 {
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
    fn bad() {
        for s in ["", "5", "ms", "5 sec", "5x", "1..5s", "-1s", "99999999999999999999999999999999999999d"] {
            assert!(parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn shows() {
        assert_eq!(show(Duration::from_millis(500)), "500ms");
        assert_eq!(show(Duration::from_secs(8)), "8s");
        assert_eq!(show(Duration::from_secs(90)), "1m30s");
    }
}
